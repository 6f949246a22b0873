//! The few lang items and intrinsics the kernels need on `nvptx64-nvidia-cuda`, where there is
//! no `core` (none ships for that target and none can be fetched, see gpu/README.md).
//! Compiled only for the device; the host build uses the real `core`. These declarations are
//! tied to the pinned rustc (rust-toolchain.toml); a compiler upgrade may need them touched.
#![allow(clippy::all, dead_code)]

#[lang = "pointee_sized"]
pub trait PointeeSized {}
#[lang = "meta_sized"]
pub trait MetaSized: PointeeSized {}
#[lang = "sized"]
pub trait Sized: MetaSized {}
#[lang = "copy"]
pub trait Copy {}
#[lang = "legacy_receiver"]
pub trait LegacyReceiver {}
impl<T: PointeeSized> LegacyReceiver for &T {}
impl<T: PointeeSized> LegacyReceiver for &mut T {}

macro_rules! copy_impls { ($($t:ty)*) => { $(impl Copy for $t {})* } }
copy_impls!(bool f32 f64 f16 u8 u16 u32 u64 usize i32 i64);
impl<T: PointeeSized> Copy for *const T {}
impl<T: PointeeSized> Copy for *mut T {}
impl<T: PointeeSized> Copy for &T {}

macro_rules! binop {
    ($lang:literal $tr:ident $m:ident $op:tt; $($t:ty)*) => {
        #[lang = $lang]
        pub trait $tr<Rhs = Self> { type Output; fn $m(self, rhs: Rhs) -> Self::Output; }
        $(impl $tr for $t { type Output = $t; #[inline(always)] fn $m(self, r: $t) -> $t { self $op r } })*
    };
}
binop!("add" Add add +; f32 u32 u64 usize i32 i64);
binop!("sub" Sub sub -; f32 u32 u64 usize i32 i64);
binop!("mul" Mul mul *; f32 u32 u64 usize i32 i64);
binop!("div" Div div /; f32 u32 u64 usize i32 i64);
binop!("rem" Rem rem %; u32 u64 usize);
binop!("bitand" BitAnd bitand &; u32 bool);
binop!("bitor" BitOr bitor |; u32 bool);

macro_rules! assignop {
    ($lang:literal $tr:ident $m:ident $op:tt; $($t:ty)*) => {
        #[lang = $lang]
        pub trait $tr<Rhs = Self> { fn $m(&mut self, rhs: Rhs); }
        $(impl $tr for $t { #[inline(always)] fn $m(&mut self, r: $t) { *self $op r } })*
    };
}
assignop!("add_assign" AddAssign add_assign +=; f32 u32 u64 usize i32);
assignop!("sub_assign" SubAssign sub_assign -=; f32 u32 usize);
assignop!("mul_assign" MulAssign mul_assign *=; f32);

#[lang = "neg"]
pub trait Neg {
    type Output;
    fn neg(self) -> Self::Output;
}
impl Neg for f32 {
    type Output = f32;
    #[inline(always)]
    fn neg(self) -> f32 {
        -self
    }
}
impl Neg for i32 {
    type Output = i32;
    #[inline(always)]
    fn neg(self) -> i32 {
        -self
    }
}
#[lang = "not"]
pub trait Not {
    type Output;
    fn not(self) -> Self::Output;
}
impl Not for bool {
    type Output = bool;
    #[inline(always)]
    fn not(self) -> bool {
        !self
    }
}

#[lang = "eq"]
pub trait PartialEq<Rhs: PointeeSized = Self> {
    fn eq(&self, other: &Rhs) -> bool;
    fn ne(&self, other: &Rhs) -> bool;
}
#[lang = "partial_ord"]
pub trait PartialOrd<Rhs: PointeeSized = Self>: PartialEq<Rhs> {
    fn lt(&self, other: &Rhs) -> bool;
    fn le(&self, other: &Rhs) -> bool;
    fn gt(&self, other: &Rhs) -> bool;
    fn ge(&self, other: &Rhs) -> bool;
}
macro_rules! cmp_impls {
    ($($t:ty)*) => { $(
        impl PartialEq for $t {
            #[inline(always)] fn eq(&self, o: &$t) -> bool { *self == *o }
            #[inline(always)] fn ne(&self, o: &$t) -> bool { *self != *o }
        }
        impl PartialOrd for $t {
            #[inline(always)] fn lt(&self, o: &$t) -> bool { *self < *o }
            #[inline(always)] fn le(&self, o: &$t) -> bool { *self <= *o }
            #[inline(always)] fn gt(&self, o: &$t) -> bool { *self > *o }
            #[inline(always)] fn ge(&self, o: &$t) -> bool { *self >= *o }
        }
    )* };
}
cmp_impls!(f32 u32 u64 usize i32);
impl PartialEq for bool {
    #[inline(always)]
    fn eq(&self, o: &bool) -> bool {
        *self == *o
    }
    #[inline(always)]
    fn ne(&self, o: &bool) -> bool {
        *self != *o
    }
}

/// Integer `/` by a run-time value makes rustc insert a zero check whose panic path needs
/// more lang items; kernels divide only by sizes the host has validated as non-zero.
#[rustc_intrinsic]
pub unsafe fn unchecked_div<T: Copy>(x: T, y: T) -> T;

#[rustc_intrinsic]
pub unsafe fn offset<Ptr, Delta>(dst: Ptr, offset: Delta) -> Ptr;
#[rustc_intrinsic]
pub fn sqrtf32(x: f32) -> f32;
#[rustc_intrinsic]
pub fn fmaf32(a: f32, b: f32, c: f32) -> f32;

#[allow(improper_ctypes)]
extern "C" {
    #[link_name = "llvm.trap"]
    pub fn trap() -> !;
    #[link_name = "llvm.nvvm.read.ptx.sreg.tid.x"]
    pub fn thread_idx_x() -> u32;
    #[link_name = "llvm.nvvm.read.ptx.sreg.ctaid.x"]
    pub fn block_idx_x() -> u32;
    #[link_name = "llvm.nvvm.read.ptx.sreg.ntid.x"]
    pub fn block_dim_x() -> u32;
    #[link_name = "llvm.nvvm.read.ptx.sreg.nctaid.x"]
    pub fn grid_dim_x() -> u32;
    #[link_name = "llvm.nvvm.shfl.sync.bfly.f32"]
    pub fn shfl_bfly_f32(mask: u32, value: f32, lane_mask: u32, clamp: u32) -> f32;
    #[link_name = "llvm.nvvm.shfl.sync.up.f32"]
    pub fn shfl_up_f32(mask: u32, value: f32, delta: u32, clamp: u32) -> f32;
    #[link_name = "llvm.nvvm.shfl.sync.down.f32"]
    pub fn shfl_down_f32(mask: u32, value: f32, delta: u32, clamp: u32) -> f32;
    #[link_name = "llvm.nvvm.shfl.sync.idx.f32"]
    pub fn shfl_idx_f32(mask: u32, value: f32, lane: u32, clamp: u32) -> f32;
    /// `bar.sync 0` (`__syncthreads`).
    #[link_name = "llvm.nvvm.barrier0"]
    pub fn sync_threads();
}

// Device memory as the kernels see it. The emulator (`emu::device`) defines the same names as
// bounds-checked handles, so `kernels.rs` is one source for both.
pub type Ptr<T> = *const T;
pub type PtrMut<T> = *mut T;

/// `p[i]`.
#[inline(always)]
pub unsafe fn load<T: Copy>(p: *const T, i: usize) -> T {
    *offset(p, i)
}

/// `p[i] = v`.
#[inline(always)]
pub unsafe fn store<T: Copy>(p: *mut T, i: usize, v: T) {
    *offset(p, i) = v
}

/// f16 storage to f32 arithmetic (exact).
#[inline(always)]
pub fn f16_to_f32(x: f16) -> f32 {
    x as f32
}

/// f32 to f16 storage, rounded to nearest even (`cvt.rn.f16.f32`).
#[inline(always)]
pub fn f32_to_f16(x: f32) -> f16 {
    x as f16
}

/// Needed for constants of struct type (the colour matrices).
#[lang = "freeze"]
pub unsafe auto trait Freeze {}
