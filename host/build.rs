//! Compiles the `cadence-kernels` crate (../gpu) to PTX with rustc's own NVPTX backend, once
//! per target, into OUT_DIR; `src/ptx.rs` embeds the results. No CUDA toolkit is needed.
//!
//! The kernel crate is `#![no_core]` on the device (there is no `core` for nvptx64 here), which
//! needs unstable features: RUSTC_BOOTSTRAP=1 allows them for this one invocation of the
//! pinned stable compiler (as the Linux kernel does), so the workspace itself stays on stable.

use std::path::{Path, PathBuf};
use std::process::Command;

/// (name, rustc target-cpu). `portable` is a low baseline the driver JIT-compiles for any newer GPU.
const TARGETS: [(&str, &str); 3] = [("sm_90", "sm_90"), ("sm_120", "sm_120"), ("portable", "sm_75")];

fn main() {
    let manifest = PathBuf::from(std::env::var("CARGO_MANIFEST_DIR").unwrap());
    let kernel_src = manifest.join("../gpu/src");
    let lib_rs = kernel_src.join("lib.rs");
    let out_dir = PathBuf::from(std::env::var("OUT_DIR").unwrap());
    let rustc = std::env::var("RUSTC").unwrap_or_else(|_| "rustc".into());

    for entry in std::fs::read_dir(&kernel_src).expect("read gpu/src") {
        println!("cargo:rerun-if-changed={}", entry.unwrap().path().display());
    }
    println!("cargo:rerun-if-changed=build.rs");

    for (name, cpu) in TARGETS {
        let out = out_dir.join(format!("cadence_kernels_{name}.ptx"));
        compile(&rustc, &lib_rs, cpu, &out);
        let ptx = std::fs::read_to_string(&out).expect("read PTX");
        check_entries(&ptx, name);
    }
    let version =
        Command::new(&rustc).arg("--version").output().map(|o| String::from_utf8_lossy(&o.stdout).trim().to_string());
    println!("cargo:rustc-env=CADENCE_PTX_RUSTC={}", version.unwrap_or_else(|_| "unknown".into()));
}

/// The PTX exports exactly the entry points of the kernel table (`cadence_kernels::KERNELS`,
/// the one list the CUDA backend and the emulator use too).
fn check_entries(ptx: &str, target: &str) {
    let exported: Vec<&str> = ptx
        .lines()
        .filter_map(|l| l.trim_start().strip_prefix(".visible .entry "))
        .map(|l| l.split('(').next().unwrap_or(l).trim())
        .collect();
    for k in &cadence_kernels::KERNELS {
        assert!(exported.contains(&k.name), "PTX for {target} lacks kernel {}", k.name);
    }
    for e in &exported {
        assert!(
            cadence_kernels::KERNELS.iter().any(|k| k.name == *e),
            "PTX for {target} exports {e}, which the table in gpu/src/lib.rs (KERNELS) does not list"
        );
    }
}

fn compile(rustc: &str, lib_rs: &Path, cpu: &str, out: &Path) {
    let status = Command::new(rustc)
        .env("RUSTC_BOOTSTRAP", "1")
        .args(["--edition", "2021", "--crate-type=lib", "--crate-name", "cadence_kernels"])
        .args(["--target", "nvptx64-nvidia-cuda", "--emit=asm", "-O"])
        .arg(format!("-Ctarget-cpu={cpu}"))
        .arg(lib_rs)
        .arg("-o")
        .arg(out)
        .status()
        .unwrap_or_else(|e| panic!("cannot run {rustc} to compile the kernels: {e}"));
    if !status.success() {
        panic!(
            "rustc failed to compile gpu/src to PTX for {cpu}. This needs the toolchain pinned in \
             rust-toolchain.toml (its LLVM has the NVPTX backend)."
        );
    }
}
