//! What a probe's report section is: everything the report writes for one finding (CSV tables,
//! `.npy` arrays, SVG charts, the HTML block and the text summary lines), behind one trait, so the
//! report iterates sections instead of switching on probes.

use std::path::Path;

use kvprobe_schema::Results;

use crate::error::Result;

/// A chart: (file name, SVG text).
pub type Chart = (&'static str, String);

/// One section of report.html: a summary table, its chart(s), and the full table.
pub struct ProbeBlock {
    pub id: &'static str,
    pub title: &'static str,
    pub summary: String,
    pub chart: String,
    pub detail: String,
}

/// The report side of one probe (or of one diagnosis finding). Every method reads the finding
/// from `Results` and returns nothing when it is absent; the defaults are "nothing to write".
pub trait ProbeSection: Sync {
    /// CSV tables: (file name, contents).
    fn tables(&self, _r: &Results) -> Vec<(String, String)> {
        Vec::new()
    }
    /// File names of the `.npy` arrays [`write_arrays`](Self::write_arrays) writes.
    fn array_files(&self, _r: &Results) -> Vec<String> {
        Vec::new()
    }
    fn write_arrays(&self, _r: &Results, _dir: &Path) -> Result<()> {
        Ok(())
    }
    /// File-name prefixes of those arrays: a caller-supplied array may not start with one.
    fn reserved_prefixes(&self) -> &'static [&'static str] {
        &[]
    }
    fn charts(&self, _r: &Results) -> Result<Vec<Chart>> {
        Ok(Vec::new())
    }
    /// Whether this section's charts and arrays come after every other section's in the
    /// artefact list (its files were appended there when it was added; kept so a re-render of
    /// an older run folder stays byte-identical).
    fn files_listed_last(&self) -> bool {
        false
    }
    /// The HTML block; `charts` are this run's charts, looked up by file name.
    fn block(&self, r: &Results, charts: &[Chart]) -> Option<ProbeBlock>;
    /// Lines of the text summary a single probe run prints (none under a verdict).
    fn summary(&self, _r: &Results) -> String {
        String::new()
    }
}
