//! `stride_table` and `cross_arch` end to end on a tiny clip, with the table's arithmetic checked
//! row by row; and a failure while a CSV or a plot is being written.

mod common;
use common::run;
use std::os::unix::process::CommandExt;
use std::process::Command;

#[derive(serde::Deserialize, Debug)]
struct StrideRow {
    stride: usize,
    infill: String,
    frames: usize,
    keyframes: usize,
    unet_evaluations: usize,
    bypassed_frames: usize,
    unet_duty_cycle_pct: f64,
    audio_encoder_ms: f64,
    avatar_encoder_ms: f64,
    unet_ms: f64,
    decoder_ms: f64,
    pure_neural_ms: f64,
    neural_fps: f64,
    neural_rtf: f64,
    outside_neural_pct: f64,
    encoder: String,
    encoder_ms: f64,
    end_to_end_ms: f64,
    end_to_end_fps: f64,
    end_to_end_rtf: f64,
    decoded_frames: usize,
    unet_cpu_ms: Option<f64>,
    decoder_cpu_ms: Option<f64>,
    neural_cpu_ms: Option<f64>,
    neural_gain: f64,
    end_to_end_gain: f64,
    full_projected_neural_ms: Option<f64>,
    full_projected_end_to_end_ms: Option<f64>,
    full_projected_neural_gain: Option<f64>,
}

fn close(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-9 * a.abs().max(b.abs()).max(1e-12)
}

#[test]
fn stride_table_and_cross_arch_on_a_tiny_clip() {
    let dir = tempfile::tempdir().unwrap();
    let out = dir.path().to_str().unwrap();
    // 25 frames (1 s): the clip's first speech (0.39-1.18 s by Silero) is in it and lasts past
    // Silero's 250 ms minimum, so both strides run the UNet.
    let args = ["--frames", "25", "--strides", "1,3", "--batch", "4", "--backend", "cpu", "--device", "cpu"];
    run(env!("CARGO_BIN_EXE_stride_table"), &[&args[..], &["--out", out]].concat());
    let csv = dir.path().join("stride_table.csv");
    let rows: Vec<StrideRow> = experiments::read_rows(&csv).unwrap();
    // Stride 1 once; stride 3 with each infill (--infill latent,image by default).
    let runs: Vec<(usize, &str)> = rows.iter().map(|r| (r.stride, r.infill.as_str())).collect();
    assert_eq!(runs, [(1, "latent"), (3, "latent"), (3, "image")]);
    for r in &rows {
        // 25 frames: every frame at stride 1; 0, 3, .., 24 at stride 3.
        assert_eq!((r.frames, r.keyframes), (25, if r.stride == 1 { 25 } else { 9 }), "{r:?}");
        assert!(r.unet_evaluations <= r.keyframes && r.bypassed_frames <= r.frames, "{r:?}");
        assert!(close(r.unet_duty_cycle_pct, 100.0 * r.keyframes as f64 / 25.0), "{r:?}");
        assert!(close(r.pure_neural_ms, r.audio_encoder_ms + r.avatar_encoder_ms + r.unet_ms + r.decoder_ms), "{r:?}");
        assert!(close(r.neural_fps, 25.0 / (r.pure_neural_ms * 1e-3)) && close(r.neural_rtf, r.neural_fps / 25.0));
        assert!(
            close(r.end_to_end_fps, 25.0 / (r.end_to_end_ms * 1e-3))
                && close(r.end_to_end_rtf, r.end_to_end_fps / 25.0)
        );
        let outside = r.end_to_end_ms - r.pure_neural_ms - r.encoder_ms;
        assert!(close(r.outside_neural_pct, 100.0 * outside / (r.end_to_end_ms - r.encoder_ms)), "{r:?}");
        assert!(outside > 0.0 && r.end_to_end_ms > r.pure_neural_ms + r.encoder_ms, "{r:?}");
        assert_eq!(r.encoder, "openh264");
    }
    for r in &rows {
        // Gains over stride 1, CPU times of the render's threads, and the full profile projected.
        assert!(close(r.neural_gain, rows[0].pure_neural_ms / r.pure_neural_ms), "{r:?}");
        assert!(close(r.end_to_end_gain, rows[0].end_to_end_ms / r.end_to_end_ms), "{r:?}");
        let (unet_cpu, decoder_cpu, neural_cpu) =
            (r.unet_cpu_ms.unwrap(), r.decoder_cpu_ms.unwrap(), r.neural_cpu_ms.unwrap());
        assert!(unet_cpu > 0.0 && decoder_cpu > 0.0 && neural_cpu >= unet_cpu + decoder_cpu, "{r:?}");
        if r.infill == "image" {
            assert_eq!(r.decoded_frames, r.unet_evaluations, "image infill decodes the keyframes only: {r:?}");
        } else {
            assert_eq!(r.decoded_frames, r.frames - r.bypassed_frames, "every frame not bypassed is decoded: {r:?}");
        }
        let (full_neural, full_e2e) = (r.full_projected_neural_ms.unwrap(), r.full_projected_end_to_end_ms.unwrap());
        assert!(full_neural > 5.0 * r.pure_neural_ms, "the published sizes cost more: {r:?}");
        assert!(full_e2e > full_neural, "{r:?}");
        let gain = rows[0].full_projected_neural_ms.unwrap() / full_neural;
        assert!(close(r.full_projected_neural_gain.unwrap(), gain), "{r:?}");
    }
    assert!(rows[1].full_projected_neural_ms < rows[0].full_projected_neural_ms, "{rows:?}");
    // Image infill projects the decoder on the keyframes only: below latent's at the same stride.
    assert!(rows[2].full_projected_neural_ms < rows[1].full_projected_neural_ms, "{rows:?}");
    // The same bypassed frames at both strides (same audio); fewer UNet evaluations at stride 3.
    assert_eq!(rows[0].bypassed_frames, rows[1].bypassed_frames);
    assert!(0 < rows[1].unet_evaluations && rows[1].unet_evaluations < rows[0].unet_evaluations, "{rows:?}");
    for f in ["stride_table_fps.png", "stride_table_fps.svg"] {
        assert!(dir.path().join(f).is_file(), "{f}");
    }

    // Without Ditto's table the Ditto columns say how to make it.
    let no_ditto = dir.path().join("no_such_ditto.csv");
    let cross_args = |ditto: &std::path::Path| {
        run(
            env!("CARGO_BIN_EXE_cross_arch"),
            &["--stride-table", csv.to_str().unwrap(), "--ditto-table", ditto.to_str().unwrap(), "--out", out],
        );
        std::fs::read_to_string(dir.path().join("cross_arch.csv")).unwrap()
    };
    let cross = cross_args(&no_ditto);
    let data: Vec<&str> = cross.lines().filter(|l| !l.starts_with('#')).collect();
    assert_eq!(data.len(), 3, "{cross}");
    for (line, r) in data[1..].iter().zip(&rows) {
        let cells: Vec<&str> = line.split(',').collect();
        assert_eq!(cells[0].parse::<usize>().unwrap(), r.stride);
        assert!(close(cells[1].parse::<f64>().unwrap(), r.neural_fps), "{line}");
        assert!(close(cells[3].parse::<f64>().unwrap(), r.end_to_end_fps), "{line}");
        assert!(line.contains("missing"), "the Ditto column says what is missing: {line}");
    }
    // MuseTalk's image infill: a column beside its stride's latent row (none at stride 1).
    let header: Vec<&str> = data[0].split(',').collect();
    let image_col = header.iter().position(|h| *h == "musetalk_image_end_to_end_fps").unwrap();
    assert_eq!(data[1].split(',').nth(image_col), Some(""), "{cross}");
    let image_fps: f64 = data[2].split(',').nth(image_col).unwrap().parse().unwrap();
    assert!((image_fps - rows[2].end_to_end_fps).abs() < 0.006, "{cross}");

    // Ditto's stride table on the same tiny clip (two DDIM steps), then both in the cross table.
    let ditto_args = ["--engine", "ditto", "--ditto-steps", "2", "--ditto-infill", "image,motion"];
    run(env!("CARGO_BIN_EXE_stride_table"), &[&args[..], &ditto_args[..], &["--out", out]].concat());
    let ditto_csv = dir.path().join("stride_table_ditto.csv");
    let ditto: Vec<StrideRow> = experiments::read_rows(&ditto_csv).unwrap();
    // Stride 1 once (dense), stride 3 once per infill.
    assert_eq!(ditto.iter().map(|r| r.stride).collect::<Vec<_>>(), [1, 3, 3]);
    assert!(ditto.iter().all(|r| r.frames == 25 && r.bypassed_frames == ditto[0].bypassed_frames));
    assert!(ditto[1].unet_evaluations < ditto[0].unet_evaluations);
    let cross = cross_args(&ditto_csv);
    let data: Vec<&str> = cross.lines().filter(|l| !l.starts_with('#')).collect();
    let header: Vec<&str> = data[0].split(',').collect();
    let col = |name: &str| header.iter().position(|h| *h == name).unwrap();
    let stride3: Vec<&str> = data[2].split(',').collect();
    let image_fps: f64 = stride3[col("ditto_image_end_to_end_fps")].parse().unwrap();
    assert!((image_fps - ditto[1].end_to_end_fps).abs() < 0.006, "{cross}");
    let speedup: f64 = stride3[col("ditto_image_speedup")].parse().unwrap();
    assert!((speedup - ditto[1].end_to_end_fps / ditto[0].end_to_end_fps).abs() < 0.006, "{cross}");
    // Feature infill was not measured: its column says so.
    assert!(stride3[col("ditto_feature_end_to_end_fps")].starts_with("missing"), "{cross}");
    assert!(cross.contains("# source: "), "{cross}");
}

/// The synthetic part of lerp_slerp_ablation writes a 46 kB CSV and then plots of 100 kB and
/// more: with the child's file-size limit at 64 kB the CSV is written and the first plot fails
/// while it is being written; at 8 kB the CSV itself fails. Either way the run fails, and what
/// was not finished is not there, not even as a temporary file.
#[test]
fn a_failure_while_writing_a_csv_or_plot_leaves_nothing_unfinished() {
    for (limit, csv_done) in [(64u64 << 10, true), (8 << 10, false)] {
        let dir = tempfile::tempdir().unwrap();
        let mut c = Command::new(env!("CARGO_BIN_EXE_lerp_slerp_ablation"));
        c.args(["--skip-trajectory", "--out"]).arg(dir.path());
        // SAFETY: async-signal-safe calls between fork and exec.
        unsafe {
            c.pre_exec(move || {
                libc::signal(libc::SIGXFSZ, libc::SIG_IGN);
                let lim = libc::rlimit { rlim_cur: limit, rlim_max: limit };
                if libc::setrlimit(libc::RLIMIT_FSIZE, &lim) != 0 {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            })
        };
        let o = c.output().unwrap();
        let err = String::from_utf8_lossy(&o.stderr);
        assert!(!o.status.success() && !err.contains("panicked"), "limit {limit}: {err}");
        let names: Vec<String> = std::fs::read_dir(dir.path())
            .unwrap()
            .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
            .collect();
        let expected: Vec<&str> = if csv_done { vec!["lerp_slerp_norm.csv"] } else { vec![] };
        assert_eq!(names, expected, "limit {limit}: {err}");
    }
}
