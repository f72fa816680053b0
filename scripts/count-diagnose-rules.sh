#!/usr/bin/env bash
# Counts what the diagnosis decides with (issue 34's before/after): rules per table (the rows of
# docs/diagnosis.md's `<!-- rules:NAME -->` lists, which a unit test keeps equal to the code's
# tables), `ranked_after` edges in the rules' non-test code, and numeric decision constants
# (`const NAME: f64/f32/usize/... = <number>` in probes/src/thresholds.rs and probes/src/diagnose/).
# Usage: scripts/count-diagnose-rules.sh   (run from any folder of the checkout)
set -euo pipefail
ROOT="$(cd "$(dirname "${BASH_SOURCE[0]}")/.." && pwd)"
cd "$ROOT"
total=0
for t in ring stateful capacity stage; do
    n=$(awk -v s="<!-- rules:$t -->" -v e="<!-- /rules:$t -->" '$0==s{on=1;next} $0==e{on=0} on && /^\|/ && /`/' docs/diagnosis.md | wc -l)
    echo "rules $t: $n"
    total=$((total + n))
done
echo "rules total: $total"
# code before the first `#[cfg(test)]` of each file: tests may build edges of their own
nontest() { for f in "$@"; do awk '/^#\[cfg\(test\)\]/{exit} {print}' "$f"; done; }
mapfile -t files < <(find probes/src/diagnose -name '*.rs' | sort)
echo "ranked_after edges: $(nontest "${files[@]}" | grep -o '\.ranked_after(' | wc -l)"
const_re='^\s*(pub(\([a-z]+\))?\s+)?const\s+[A-Z_0-9]+\s*:\s*(f32|f64|usize|u32|i64|u64)\s*=\s*-?[0-9]'
echo "decision constants thresholds.rs: $(nontest probes/src/thresholds.rs | grep -Ec "$const_re")"
echo "decision constants diagnose/: $(nontest "${files[@]}" | grep -Ec "$const_re")"
