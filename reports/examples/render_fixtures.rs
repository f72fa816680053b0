//! Writes the hand-built fixture runs into a folder, to look at the report:
//! `cargo run -p kvprobe-reports --example render_fixtures -- OUT_DIR`
//! gives OUT_DIR/{healthy,faulty,large}/report.html and OUT_DIR/compare/compare.html.

use kvprobe_reports::{fixtures, render_compare, write_artifacts};
use std::path::PathBuf;

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let out = PathBuf::from(
        std::env::args()
            .nth(1)
            .ok_or("usage: render_fixtures OUT_DIR")?,
    );
    write_artifacts(&fixtures::healthy_results(), &[], &out.join("healthy"))?;
    write_artifacts(&fixtures::faulty_results(), &[], &out.join("faulty"))?;
    write_artifacts(
        &fixtures::large_colmap_results(600),
        &[],
        &out.join("large"),
    )?;
    render_compare(
        &out.join("faulty"),
        &out.join("healthy"),
        &out.join("compare"),
    )?;
    println!("{}", out.display());
    Ok(())
}
