//! Opening the real third-party runtimes' devices (`--onnx DIR`, `--openvino DIR`) from the
//! device flags.

use std::path::Path;
use std::sync::Arc;

use kvprobe_npu::onnx::{parse_ep_option, Ep, OnnxDevice, OnnxOptions};
use kvprobe_npu::openvino::{OvDevice, OvOptions, OvTarget};
use kvprobe_reference::Model;

use super::device_args::{npu_error, Backend, DeviceArgs};

impl DeviceArgs {
    /// `--onnx DIR`: the GenAI folder with the chosen execution provider; the driver sends the
    /// rows of `model`'s embedding table, which the device maps back to token ids.
    pub(super) fn open_onnx(&self, dir: &Path, model: &Arc<Model>) -> anyhow::Result<Backend> {
        let ep = match &self.ep {
            Some(e) => Ep::parse(e).map_err(npu_error)?,
            None => Ep::Cpu,
        };
        let ep_options = self
            .ep_options
            .iter()
            .map(|s| parse_ep_option(s))
            .collect::<Result<Vec<_>, _>>()
            .map_err(npu_error)?;
        let opts = OnnxOptions {
            dir: dir.to_path_buf(),
            ep,
            ep_options,
            max_ctx: self.max_ctx,
            faults: self
                .faults
                .iter()
                .map(|f| kvprobe_npu::onnx::faults::parse(f))
                .collect::<Result<Vec<_>, _>>()
                .map_err(npu_error)?,
            allow_cpu_fallback: self.allow_cpu_fallback,
            ep_given: self.ep.is_some(),
            as_written: false,
        };
        let dev = OnnxDevice::open(model, &opts).map_err(npu_error)?;
        Ok(Backend::Onnx(Box::new(dev)))
    }

    /// `--openvino DIR`: the IR compiled on the chosen plugin with every `--ov-config` key.
    pub(super) fn open_openvino(&self, dir: &Path, model: &Arc<Model>) -> anyhow::Result<Backend> {
        let target = match &self.ov_device {
            Some(d) => OvTarget::parse(d).map_err(npu_error)?,
            None => OvTarget::Cpu,
        };
        let config = self
            .ov_config
            .iter()
            .map(|s| kvprobe_npu::openvino::parse_config(s))
            .collect::<Result<Vec<_>, _>>()
            .map_err(npu_error)?;
        let opts = OvOptions {
            dir: dir.to_path_buf(),
            target,
            config,
            max_ctx: self.max_ctx,
            faults: self
                .faults
                .iter()
                .map(|f| kvprobe_npu::openvino::faults::parse(f))
                .collect::<Result<Vec<_>, _>>()
                .map_err(npu_error)?,
        };
        let dev = OvDevice::open(model, &opts).map_err(npu_error)?;
        Ok(Backend::OpenVino(Box::new(dev)))
    }
}
