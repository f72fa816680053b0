//! `kvprobe report DIR` re-renders a run's report.html and charts from its results.json;
//! `kvprobe report --compare BEFORE AFTER --out DIR` writes the before/after page (issue 5).
//! Every failure is an input error: one line, exit code 2.

use std::path::PathBuf;

use clap::Args;

use super::common::{print_stdout, usage};

#[derive(Debug, Args)]
pub struct ReportArgs {
    /// Run folder to re-render (the --out DIR of a kvprobe run).
    #[arg(
        value_name = "DIR",
        required_unless_present = "compare",
        conflicts_with = "compare"
    )]
    pub dir: Option<PathBuf>,
    /// Before/after page from two run folders.
    #[arg(long, num_args = 2, value_names = ["BEFORE", "AFTER"], requires = "out")]
    pub compare: Option<Vec<PathBuf>>,
    /// Folder for compare.html (created if missing).
    #[arg(long, value_name = "DIR", requires = "compare")]
    pub out: Option<PathBuf>,
    /// Also write DIR/summary.md: verdict, evidence, command, device and versions, prompt tokens
    /// and the key table as Markdown, to paste into a forum post or a GitHub issue.
    #[arg(long, conflicts_with = "compare")]
    pub markdown: bool,
}

pub fn run(args: ReportArgs) -> anyhow::Result<()> {
    match (args.compare, args.out, args.dir) {
        (Some(pair), Some(out), _) => {
            let [before, after] = <[PathBuf; 2]>::try_from(pair)
                .map_err(|_| usage("--compare takes two folders: BEFORE AFTER"))?;
            kvprobe_reports::render_compare(&before, &after, &out)
                .map_err(|e| usage(e.to_string()))?;
            let page = out.join(kvprobe_reports::COMPARE_HTML);
            print_stdout(format!("{}\n", page.display()).as_bytes())?;
        }
        (None, _, Some(dir)) => {
            kvprobe_reports::render_report(&dir).map_err(|e| usage(e.to_string()))?;
            let page = dir.join(kvprobe_reports::REPORT_HTML);
            print_stdout(format!("{}\n", page.display()).as_bytes())?;
            if args.markdown {
                kvprobe_reports::render_markdown(&dir).map_err(|e| usage(e.to_string()))?;
                let md = dir.join(kvprobe_reports::SUMMARY_MD);
                print_stdout(format!("{}\n", md.display()).as_bytes())?;
            }
        }
        _ => {
            return Err(usage(
                "kvprobe report needs DIR, or --compare BEFORE AFTER --out DIR",
            ))
        }
    }
    Ok(())
}
