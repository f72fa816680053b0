//! kvprobe library side of the CLI: argument parsing and the subcommands (`cli`), kept in a
//! library so that tests and other binaries can drive them.

pub mod cli;
