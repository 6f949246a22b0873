//! Which candle [`Device`] the engines run on: a user request `auto`, `cpu`, `cuda` or `cuda:N`
//! ([`DeviceRequest`]) mapped to a device by [`engine_device`] / [`select_device`].
//!
//! - `cpu`: the CPU, always.
//! - `cuda[:N]`: CUDA device N (default 0). In a build without this crate's `cuda` feature (the
//!   host's `engines-cuda`) this is an [`EngineError::Unavailable`] naming the feature and
//!   `scripts/build_cuda.sh`; when the device does not open (no driver, no GPU, bad ordinal)
//!   candle's error is wrapped in one that says which device was asked for.
//! - `auto`: CUDA device 0 when the `cuda` feature is compiled in and the device opens, else the
//!   CPU; [`EngineDevice::label`] says why it fell back.

use crate::{Device, EngineError, Result};
use std::fmt;
use std::str::FromStr;

/// The `--help` text of every `--device` flag (the cadence CLI and the experiments).
pub const DEVICE_HELP: &str = "Device of the neural engines: auto (CUDA device 0 when this binary was built with the `engines-cuda` feature and a GPU opens, else the CPU), cpu, cuda or cuda:N (needs a build with `engines-cuda`: scripts/build_cuda.sh)";

/// Whether this build has candle's CUDA backend (this crate's `cuda` feature).
pub const CUDA_COMPILED: bool = cfg!(feature = "cuda");

/// What the user asked for: `auto`, `cpu`, `cuda` or `cuda:N`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum DeviceRequest {
    /// CUDA device 0 when compiled in and it opens, else the CPU.
    #[default]
    Auto,
    Cpu,
    /// CUDA device with this ordinal (`cuda` = `cuda:0`).
    Cuda(usize),
}

impl DeviceRequest {
    /// Parses `auto`, `cpu`, `cuda` or `cuda:N` (case-insensitive, surrounding spaces ignored).
    pub fn parse(s: &str) -> Result<DeviceRequest> {
        let t = s.trim().to_ascii_lowercase();
        let bad = |why: String| {
            EngineError::BadInput(format!("engine device `{s}`: {why} (expected auto, cpu, cuda or cuda:N)"))
        };
        match t.as_str() {
            "auto" => Ok(DeviceRequest::Auto),
            "cpu" => Ok(DeviceRequest::Cpu),
            "cuda" => Ok(DeviceRequest::Cuda(0)),
            _ => match t.strip_prefix("cuda:") {
                Some(n) => n
                    .parse::<usize>()
                    .map(DeviceRequest::Cuda)
                    .map_err(|_| bad(format!("`{n}` is not a device ordinal"))),
                None => Err(bad("unknown device".into())),
            },
        }
    }

    /// [`DeviceRequest::parse`] for a command-line parser (clap's `value_parser`): the message
    /// without the error kind's prefix.
    pub fn parse_arg(s: &str) -> std::result::Result<DeviceRequest, String> {
        DeviceRequest::parse(s).map_err(|e| match e {
            EngineError::BadInput(m) => m,
            e => e.to_string(),
        })
    }
}

impl FromStr for DeviceRequest {
    type Err = EngineError;
    fn from_str(s: &str) -> Result<DeviceRequest> {
        DeviceRequest::parse(s)
    }
}

impl fmt::Display for DeviceRequest {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            DeviceRequest::Auto => f.write_str("auto"),
            DeviceRequest::Cpu => f.write_str("cpu"),
            DeviceRequest::Cuda(n) => write!(f, "cuda:{n}"),
        }
    }
}

/// The device [`select_device`] chose, with a description for summaries and provenance.
#[derive(Debug, Clone)]
pub struct EngineDevice {
    pub device: Device,
    pub request: DeviceRequest,
    /// Why `auto` did not pick CUDA (None when it did, or for an explicit request).
    pub fallback: Option<String>,
}

impl EngineDevice {
    /// `cpu`, `cuda:0 (NVIDIA H200)`, or `cpu (auto: <reason CUDA was not used>)`.
    pub fn label(&self) -> String {
        let base = device_label(&self.device);
        match &self.fallback {
            Some(why) => format!("{base} (auto: {why})"),
            None => base,
        }
    }
}

impl fmt::Display for EngineDevice {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.label())
    }
}

/// `cpu`, `cuda:N` (with the GPU's name when the driver gives it) or `metal:N`.
pub fn device_label(device: &Device) -> String {
    match device {
        Device::Cpu => "cpu".to_string(),
        Device::Cuda(_d) => {
            let n = match device.location() {
                candle_core::DeviceLocation::Cuda { gpu_id } => gpu_id,
                _ => 0,
            };
            #[cfg(feature = "cuda")]
            {
                if let Ok(name) = _d.cuda_stream().context().name() {
                    return format!("cuda:{n} ({name})");
                }
            }
            format!("cuda:{n}")
        }
        Device::Metal(_) => match device.location() {
            candle_core::DeviceLocation::Metal { gpu_id } => format!("metal:{gpu_id}"),
            _ => "metal".to_string(),
        },
    }
}

fn not_compiled() -> EngineError {
    EngineError::Unavailable(
        "this build has no CUDA support for the neural engines: rebuild with the `engines-cuda` \
         feature of the cadence crate (cadence-engines feature `cuda`), e.g. scripts/build_cuda.sh, \
         or use --device cpu"
            .to_string(),
    )
}

fn open_cuda(ordinal: usize) -> Result<Device> {
    if !CUDA_COMPILED {
        return Err(not_compiled());
    }
    Device::new_cuda(ordinal).map_err(|e| {
        EngineError::Unavailable(format!(
            "cannot open CUDA device {ordinal} for the neural engines (needs an NVIDIA GPU, its \
             driver's libcuda.so.1 and the CUDA libraries on LD_LIBRARY_PATH; see \
             scripts/build_cuda.sh): {e}"
        ))
    })
}

/// Maps a request to a device; see the module docs for the rules. The first CPU device selected
/// sets the CPU engines' heap policy ([`crate::heap`]).
pub fn select_device(request: DeviceRequest) -> Result<EngineDevice> {
    let (device, fallback) = match request {
        DeviceRequest::Cpu => (Device::Cpu, None),
        DeviceRequest::Cuda(n) => (open_cuda(n)?, None),
        DeviceRequest::Auto if !CUDA_COMPILED => {
            (Device::Cpu, Some("built without the engines' CUDA feature".to_string()))
        }
        DeviceRequest::Auto => match Device::new_cuda(0) {
            Ok(d) => (d, None),
            Err(e) => (Device::Cpu, Some(format!("CUDA device 0 did not open: {}", one_line(&e)))),
        },
    };
    if device.is_cpu() {
        crate::heap::retain_freed_blocks();
    }
    Ok(EngineDevice { device, request, fallback })
}

/// [`select_device`] without the description.
pub fn engine_device(request: DeviceRequest) -> Result<Device> {
    select_device(request).map(|d| d.device)
}

fn one_line(e: &dyn fmt::Display) -> String {
    e.to_string().replace(['\r', '\n'], " ")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_requests() {
        assert_eq!(DeviceRequest::parse("auto").unwrap(), DeviceRequest::Auto);
        assert_eq!(DeviceRequest::parse("cpu").unwrap(), DeviceRequest::Cpu);
        assert_eq!(DeviceRequest::parse(" CPU ").unwrap(), DeviceRequest::Cpu);
        assert_eq!(DeviceRequest::parse("cuda").unwrap(), DeviceRequest::Cuda(0));
        assert_eq!(DeviceRequest::parse("cuda:3").unwrap(), DeviceRequest::Cuda(3));
        assert_eq!(DeviceRequest::default(), DeviceRequest::Auto);
        for r in [DeviceRequest::Auto, DeviceRequest::Cpu, DeviceRequest::Cuda(2)] {
            assert_eq!(r.to_string().parse::<DeviceRequest>().unwrap(), r);
        }
    }

    #[test]
    fn bad_requests_are_clear_errors() {
        for (s, needle) in [
            ("gpu", "unknown device"),
            ("cuda:x", "`x` is not a device ordinal"),
            ("cuda:", "`` is not a device ordinal"),
            ("cuda:-1", "`-1` is not a device ordinal"),
            ("", "unknown device"),
        ] {
            let e = DeviceRequest::parse(s).unwrap_err();
            assert!(matches!(e, EngineError::BadInput(_)), "{s}: {e:?}");
            let msg = e.to_string();
            assert!(msg.contains(needle), "{s}: {msg}");
            assert!(msg.contains("expected auto, cpu, cuda or cuda:N"), "{msg}");
            let arg = DeviceRequest::parse_arg(s).unwrap_err();
            assert!(arg.starts_with("engine device `"), "no error-kind prefix: {arg}");
        }
        assert_eq!(DeviceRequest::parse_arg("cuda:1"), Ok(DeviceRequest::Cuda(1)));
    }

    #[test]
    fn cpu_selects_the_cpu() {
        let d = select_device(DeviceRequest::Cpu).unwrap();
        assert!(d.device.is_cpu());
        assert_eq!(d.label(), "cpu");
        assert!(engine_device(DeviceRequest::Cpu).unwrap().is_cpu());
        assert_eq!(crate::Profile::default_for(&d.device), crate::Profile::Cpu);
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn cuda_without_the_feature_names_it() {
        for r in [DeviceRequest::Cuda(0), DeviceRequest::Cuda(1)] {
            let e = engine_device(r).unwrap_err();
            assert!(matches!(e, EngineError::Unavailable(_)), "{e:?}");
            let msg = e.to_string();
            assert!(msg.contains("`engines-cuda`"), "{msg}");
            assert!(msg.contains("`cuda`"), "{msg}");
            assert!(msg.contains("scripts/build_cuda.sh"), "{msg}");
            assert!(!msg.contains('\n'), "{msg}");
        }
    }

    #[cfg(not(feature = "cuda"))]
    #[test]
    fn auto_without_the_feature_is_the_cpu_and_says_why() {
        let d = select_device(DeviceRequest::Auto).unwrap();
        assert!(d.device.is_cpu());
        assert_eq!(d.label(), "cpu (auto: built without the engines' CUDA feature)");
    }

    /// With the feature, `auto` never fails: CUDA when a device opens, else the CPU with the reason.
    #[cfg(feature = "cuda")]
    #[test]
    fn auto_with_the_feature_never_fails() {
        let d = select_device(DeviceRequest::Auto).unwrap();
        assert_eq!(d.device.is_cuda(), d.fallback.is_none());
        if d.device.is_cuda() {
            assert_eq!(crate::Profile::default_for(&d.device), crate::Profile::Full);
            assert!(d.label().starts_with("cuda:0"), "{}", d.label());
        }
    }
}
