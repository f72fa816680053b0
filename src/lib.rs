//! kvprobe library side of the CLI
