//! `POST /calibrate` and `GET /v1/calibration` over real HTTP: the source's JSON keys and
//! cadence's extras, the cache, the bounds, and the server unready while it measures.

mod common;

use common::*;
use std::time::Duration;

#[test]
fn calibrate_answers_the_sources_shape_with_the_extras_and_caches_it() {
    let _r = render_lock();
    let s = start(&["--slots", "2"]);
    let r = get(&s, "/v1/calibration");
    assert_eq!((r.status().as_u16(), error_code(r).as_str()), (404, "no_calibration"));
    let c = client();
    for bad in ["frames=4", "frames=251", "runs=0", "runs=6", "strides=1,2", "infill=pixels"] {
        let r = c.post(s.url(&format!("/calibrate?{bad}"))).send().unwrap();
        assert_eq!(r.status(), 422, "{bad}");
    }

    // A short run, on another thread: the server is unready while it holds the slots.
    let url = s.url("/calibrate?frames=10&runs=1");
    let h = std::thread::spawn(move || {
        let r = client().post(url).send().unwrap();
        assert_eq!(r.status(), 200);
        r.json::<serde_json::Value>().unwrap()
    });
    wait_for(Duration::from_secs(30), || get(&s, "/readyz").status() == 503);
    assert_eq!(error_code(get(&s, "/readyz")), "calibrating");
    assert_eq!(metric(&s, "cadence_renders_running"), 2.0, "the calibration holds both slots");
    let r = c.post(s.url("/generate")).multipart(form(tone_wav(0.2), &[])).send().unwrap();
    assert_eq!((r.status().as_u16(), error_code(r).as_str()), (503, "calibrating"));
    let r = c.post(s.url("/calibrate?frames=10&runs=1")).send().unwrap();
    assert_eq!((r.status().as_u16(), error_code(r).as_str()), (503, "calibrating"));
    let v = h.join().unwrap();
    assert_eq!(get(&s, "/readyz").status(), 200);
    assert_eq!(metric(&s, "cadence_renders_running"), 0.0);

    // The source's keys.
    let m = &v["benchmarks"]["musetalk"];
    for engine in ["unet", "taesd"] {
        assert!(m[engine]["engine"].as_str().is_some_and(|e| !e.is_empty()), "{engine}: {m}");
        assert!(m[engine]["throughput_fps"].as_f64().unwrap() > 0.0, "{engine}");
    }
    for k in 1..=3u64 {
        let p = &m["stride_projections"][format!("stride_{k}")];
        assert_eq!(p["stride"].as_u64(), Some(k), "{p}");
        assert!(p["projected_fps"].as_f64().unwrap() > 0.0);
        assert!(p["description"].as_str().is_some_and(|d| !d.is_empty()));
        // Cadence's: the measured render beside the projection, and the error between them.
        let (projected, measured) = (p["projected_fps"].as_f64().unwrap(), p["measured_fps"].as_f64().unwrap());
        assert!(measured > 0.0);
        let err = p["error_pct"].as_f64().unwrap();
        assert!((err - 100.0 * (projected - measured) / measured).abs() < 1e-9, "{p}");
        assert_eq!(p["frames"].as_u64(), Some(10));
    }
    assert_eq!(m["stride_projections"]["stride_1"]["unet_duty_cycle"], "100%");
    // 10 frames at stride 2: keyframes 0, 2, 4, 6, 8 and the last frame.
    assert_eq!(m["stride_projections"]["stride_2"]["unet_duty_cycle"], "60%");
    // The extras.
    assert!(v["hardware"]["cpu"].as_str().is_some_and(|c| !c.is_empty()));
    assert!(v["hardware"]["logical_cpus"].as_u64().unwrap() >= 1);
    assert!(v["backend"].as_str().is_some() && v["device"].as_str().unwrap().starts_with("cpu"));
    assert_eq!(v["profile"], "cpu-reduced");
    assert!(v["weights"].as_str().unwrap().starts_with("synthetic"));
    assert_eq!(v["recommended_render_slots"], 1);
    assert_eq!((v["calibration"]["frames"].as_u64(), v["calibration"]["runs"].as_u64()), (Some(10), Some(1)));
    assert_eq!(v["calibration"]["infill"], "latent", "the default");
    assert_eq!(m["components"]["infill"], "latent");
    assert_eq!(v["calibration"]["count_mismatch"], serde_json::json!([]), "{}", v["calibration"]);

    // Cached.
    let cached: serde_json::Value = get(&s, "/v1/calibration").json().unwrap();
    assert_eq!(cached, v);
    assert!(s.temp_entries().is_empty(), "{:?}", s.temp_entries());
}

#[test]
fn calibrate_projects_and_renders_image_infill() {
    let _r = render_lock();
    let s = start(&[]);
    let r = client().post(s.url("/calibrate?frames=50&runs=1&infill=image")).send().unwrap();
    assert_eq!(r.status(), 200);
    let v: serde_json::Value = r.json().unwrap();
    let cal = &v["calibration"];
    assert_eq!(cal["infill"], "image");
    // The projected counts are the render's: the decoder ran on the evaluated keyframes only.
    assert_eq!(cal["count_mismatch"], serde_json::json!([]), "{cal}");
    let m = &v["benchmarks"]["musetalk"];
    assert_eq!(m["components"]["infill"], "image");
    for k in 1..=3 {
        let p = &m["stride_projections"][format!("stride_{k}")];
        assert_eq!(p["infill"], "image", "{p}");
        assert_eq!(p["decoded_frames"], p["unet_evaluations"], "{p}");
    }
    // 50 frames: the clip opens in silence, then speech. At stride 1 every frame not
    // bypassed is evaluated (and decoded, whatever the infill); at stride 3 image infill decodes
    // fewer.
    let (p1, p3) = (&m["stride_projections"]["stride_1"], &m["stride_projections"]["stride_3"]);
    let n = |p: &serde_json::Value, k: &str| p[k].as_u64().unwrap();
    assert!(n(p3, "unet_evaluations") > 0, "{p3}");
    assert!(n(p3, "decoded_frames") < n(p1, "decoded_frames"), "{p1} {p3}");
    assert!(p3["description"].as_str().unwrap().contains("image infill"), "{p3}");
}
