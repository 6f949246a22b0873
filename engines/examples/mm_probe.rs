use std::time::Instant;
fn main() {
    let n = 1024;
    let a = vec![0.5f32; n * n];
    let b = vec![0.25f32; n * n];
    let mut c = vec![0f32; n * n];
    for threads in [1usize, 2] {
        let mut best = f64::MAX;
        for _ in 0..5 {
            let t = Instant::now();
            unsafe {
                gemm::gemm(
                    n,
                    n,
                    n,
                    c.as_mut_ptr(),
                    1,
                    n as isize,
                    false,
                    a.as_ptr(),
                    1,
                    n as isize,
                    b.as_ptr(),
                    1,
                    n as isize,
                    0.0,
                    1.0,
                    false,
                    false,
                    false,
                    if threads == 1 { gemm::Parallelism::None } else { gemm::Parallelism::Rayon(2) },
                );
            }
            best = best.min(t.elapsed().as_secs_f64());
        }
        println!("threads {threads}: {:.0} GFLOP/s", 2.0 * (n * n * n) as f64 / best / 1e9);
    }
}
