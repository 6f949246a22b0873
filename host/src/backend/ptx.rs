//! The PTX that `build.rs` compiled from `gpu/src` with rustc's NVPTX backend, one module per
//! target, and the rule that picks one for a device.

/// One embedded PTX module.
pub struct PtxTarget {
    /// `sm_90`, `sm_120` or `portable`.
    pub name: &'static str,
    /// The `.target` inside the PTX.
    pub arch: &'static str,
    pub source: &'static str,
}

pub const TARGETS: [PtxTarget; 3] = [
    PtxTarget {
        name: "sm_90",
        arch: "sm_90",
        source: include_str!(concat!(env!("OUT_DIR"), "/cadence_kernels_sm_90.ptx")),
    },
    PtxTarget {
        name: "sm_120",
        arch: "sm_120",
        source: include_str!(concat!(env!("OUT_DIR"), "/cadence_kernels_sm_120.ptx")),
    },
    PtxTarget {
        name: "portable",
        arch: "sm_75",
        source: include_str!(concat!(env!("OUT_DIR"), "/cadence_kernels_portable.ptx")),
    },
];

/// The rustc that produced the PTX.
pub const COMPILER: &str = env!("CADENCE_PTX_RUSTC");

pub fn by_name(name: &str) -> Option<&'static PtxTarget> {
    TARGETS.iter().find(|t| t.name == name || t.arch == name)
}

/// PTX for `sm_X0` only loads on that exact family (sm_90 PTX does not JIT for sm_120 and the
/// reverse), so exact matches get their own module and everything else gets the portable one,
/// which the driver JIT-compiles for any GPU of compute capability 7.5 or newer.
pub fn for_compute_capability(major: i32, minor: i32) -> &'static PtxTarget {
    match (major, minor) {
        (9, 0) => &TARGETS[0],
        (12, 0) => &TARGETS[1],
        _ => &TARGETS[2],
    }
}

/// The `.version` line of a module (PTX ISA version).
pub fn isa_version(t: &PtxTarget) -> &'static str {
    t.source.lines().find_map(|l| l.strip_prefix(".version ")).unwrap_or("?").trim()
}
