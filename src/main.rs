//! kvprobe: finds out why an LLM compiled for an NPU generates garbage through its KV-cache.

fn main() -> std::process::ExitCode {
    kvprobe::cli::main()
}
