//! Measurement, on top of everything else: medians and the copy-bandwidth bound ([`mod@bench`]),
//! hardware calibration with projected against measured renders ([`calibrate`]), `cadence
//! gpu-check` ([`gpucheck`]), and the deterministic data the tests and benchmarks share
//! ([`fixtures`]).

pub mod bench;
pub mod calibrate;
pub mod fixtures;
pub mod gpucheck;
