use std::time::Instant;
unsafe fn g(
    m: usize,
    n: usize,
    k: usize,
    dst: *mut f32,
    drs: usize,
    lhs: *const f32,
    lrs: usize,
    rhs: *const f32,
    rrs: usize,
) {
    gemm::gemm(
        m,
        n,
        k,
        dst,
        1,
        drs as isize,
        false,
        lhs,
        1,
        lrs as isize,
        rhs,
        1,
        rrs as isize,
        0.0,
        1.0,
        false,
        false,
        false,
        gemm::Parallelism::None,
    )
}
struct P(*mut f32);
unsafe impl Send for P {}
unsafe impl Sync for P {}
impl P {
    fn p(&self) -> *mut f32 {
        self.0
    }
}
fn main() {
    for &(k, n) in &[(256usize, 256usize), (256, 512), (512, 256)] {
        let w: Vec<f32> = (0..k * n).map(|i| (i % 13) as f32 * 0.01).collect();
        let x: Vec<f32> = (0..160 * k).map(|i| (i % 7) as f32 * 0.1).collect();
        let mut out = vec![0f32; 160 * n];
        let reps = 2000;
        let time = |f: &dyn Fn()| {
            let mut best = f64::MAX;
            for _ in 0..5 {
                let t = Instant::now();
                for _ in 0..reps {
                    f()
                }
                best = best.min(t.elapsed().as_secs_f64());
            }
            best / reps as f64 * 1e6
        };
        let o = P(out.as_mut_ptr());
        let rows_split = time(&|| {
            rayon::join(
                || unsafe { g(80, n, k, o.p(), n, x.as_ptr(), k, w.as_ptr(), n) },
                || unsafe { g(80, n, k, o.p().add(80 * n), n, x.as_ptr().add(80 * k), k, w.as_ptr(), n) },
            );
        });
        let cols_split = time(&|| {
            let h = n / 2;
            rayon::join(
                || unsafe { g(160, h, k, o.p(), n, x.as_ptr(), k, w.as_ptr(), n) },
                || unsafe { g(160, h, k, o.p().add(h), n, x.as_ptr(), k, w.as_ptr().add(h), n) },
            );
        });
        let gemm_par = time(&|| unsafe {
            gemm::gemm(
                160,
                n,
                k,
                o.p(),
                1,
                n as isize,
                false,
                x.as_ptr(),
                1,
                k as isize,
                w.as_ptr(),
                1,
                n as isize,
                0.0,
                1.0,
                false,
                false,
                false,
                gemm::Parallelism::Rayon(2),
            )
        });
        let gf = |us: f64| 2.0 * 160.0 * (n * k) as f64 / us / 1e3;
        println!("160x{k}x{n}: rows split {rows_split:.1} us ({:.0} GFLOP/s), cols split {cols_split:.1} us ({:.0}), gemm rayon {gemm_par:.1} us ({:.0})", gf(rows_split), gf(cols_split), gf(gemm_par));
    }
}
