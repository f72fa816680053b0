//! The root package's end-to-end tests as one binary: one link instead of one per file, and
//! the slow files' tests share the test threads instead of running binary after binary. Each
//! file is a module (`cargo test --test e2e diagnose_faults::` runs one). The HailoRT stand-in
//! tests stay binaries of their own: CI runs them by name with the `hailo` feature.

mod common;

mod ane_diagnose;
mod capacity_faults;
mod chat_probe;
mod determinism_ane;
mod determinism_probe;
mod device_failures;
mod diagnose_faults;
mod diagnose_replay;
mod diagnose_stage;
mod diagnose_sweep;
mod fault_table_cli;
mod hostile_corpus;
mod hostile_install;
mod hostile_process;
mod hostile_signals;
mod inspect_cli;
mod issue10_probes;
mod kvdiff_faults;
mod kvdiff_report;
mod layout_infer_cli;
mod np_reference_check;
mod onnx_cli;
mod onnx_graph_faults;
mod onnx_window;
mod openvino_cli;
mod precision_matched;
mod probes_cli;
mod qnn_htp;
mod ref_cli;
mod report_cli;
mod rerun_cli;
mod structure;
