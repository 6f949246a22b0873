//! `/v1/jobs` over real HTTP: a job's lifecycle to its MP4 (read back, and in ranges), the
//! server-sent events, cancellation (running and queued), expiry, the table's bound, ids that
//! are not ids, and the job record of a streamed render.

mod common;

use common::*;
use std::io::BufRead;
use std::time::{Duration, Instant};

/// Posts a multipart job; returns its id after checking the 202 and its Location.
fn post_job(s: &TestServer, f: reqwest::blocking::multipart::Form) -> String {
    let r = client().post(s.url("/v1/jobs")).multipart(f).send().unwrap();
    assert_eq!(r.status(), 202);
    let location = header(&r, "location").to_string();
    let v: serde_json::Value = r.json().unwrap();
    let id = v["id"].as_str().unwrap().to_string();
    assert_eq!(location, format!("/v1/jobs/{id}"));
    assert!(["queued", "running"].contains(&v["state"].as_str().unwrap()), "{v}");
    id
}

fn job(s: &TestServer, id: &str) -> serde_json::Value {
    let r = get(s, &format!("/v1/jobs/{id}"));
    assert_eq!(r.status(), 200);
    r.json().unwrap()
}

fn wait_state(s: &TestServer, id: &str, state: &str, limit: Duration) -> serde_json::Value {
    wait_for(limit, || job(s, id)["state"] == state);
    job(s, id)
}

/// The server-sent events of a job until the stream ends: (event name, data).
fn events(s: &TestServer, id: &str) -> Vec<(String, serde_json::Value)> {
    let r = client().get(s.url(&format!("/v1/jobs/{id}/events"))).send().unwrap();
    assert_eq!(r.status(), 200);
    assert!(header(&r, "content-type").starts_with("text/event-stream"));
    let (mut out, mut name, mut data) = (Vec::new(), String::new(), String::new());
    for line in std::io::BufReader::new(r).lines() {
        let line = line.unwrap();
        if let Some(v) = line.strip_prefix("event: ") {
            name = v.to_string();
        } else if let Some(v) = line.strip_prefix("data: ") {
            data.push_str(v);
        } else if line.is_empty() && !data.is_empty() {
            out.push((std::mem::take(&mut name), serde_json::from_str(&std::mem::take(&mut data)).unwrap()));
        }
    }
    out
}

fn files_in(dir: &std::path::Path) -> Vec<std::path::PathBuf> {
    std::fs::read_dir(dir).unwrap().map(|e| e.unwrap().path()).collect()
}

#[test]
fn a_job_runs_to_done_with_progress_events_and_its_mp4_is_served_in_ranges() {
    let _r = render_lock();
    let jobs_dir = tempfile::tempdir().unwrap();
    let s = start(&["--jobs-dir", jobs_dir.path().to_str().unwrap(), "--window", "1"]);
    // 4 s of speech, every frame through the UNet: seconds of rendering, many progress events.
    // The synthetic portraits here have no face for the detector: the centred box.
    let f = form(speech_clip(4.0), &[("stride", "1"), ("face_box", "center")])
        .part("video", part(png(192, 160), "a.png", "image/png"));
    let id = post_job(&s, f);
    let evs = events(&s, &id);
    let (last, data) = evs.last().unwrap();
    assert_eq!(last, "done", "{evs:?}");
    assert!(evs[..evs.len() - 1].iter().all(|(n, _)| n == "progress"));
    let progress: Vec<f64> = evs.iter().map(|(_, d)| d["progress"].as_f64().unwrap()).collect();
    assert!(progress.windows(2).all(|w| w[0] <= w[1]), "progress goes back: {progress:?}");
    assert!(progress.iter().any(|&p| p > 0.0 && p < 1.0), "no progress between start and end: {progress:?}");
    assert_eq!(*progress.last().unwrap(), 1.0);
    let done: Vec<u64> = evs.iter().map(|(_, d)| d["frames_done"].as_u64().unwrap()).collect();
    assert!(done.windows(2).all(|w| w[0] <= w[1]), "{done:?}");
    let frames = data["frames"].as_u64().unwrap();
    assert_eq!((frames, *done.last().unwrap()), (100, 100));

    let v = job(&s, &id);
    assert_eq!(
        (v["state"].as_str(), v["kind"].as_str(), v["eta_seconds"].as_f64()),
        (Some("done"), Some("render"), Some(0.0))
    );
    let stats = &v["stats"];
    assert_eq!((stats["frames"].as_u64(), stats["stride"].as_u64()), (Some(100), Some(1)));
    let fps = stats["inference_fps"].as_f64().unwrap();
    assert!(fps > 0.0 && (stats["realtime_factor"].as_f64().unwrap() - fps / 25.0).abs() < 1e-9);
    assert!((1..=100).contains(&stats["keyframes_evaluated"].as_u64().unwrap()), "{stats}");
    assert!(stats["weights"].as_str().unwrap().starts_with("synthetic"));
    for stage in ["upload;dur=", "validate;dur=", "queue;dur=", "unet;dur=", "total;dur="] {
        assert!(stats["server_timing"].as_str().unwrap().contains(stage), "{stats}");
    }
    assert_eq!(v["result"], format!("/v1/jobs/{id}/result"));

    let r = get(&s, &format!("/v1/jobs/{id}/result"));
    assert_eq!(r.status(), 200);
    assert_eq!(header(&r, "content-type"), "video/mp4");
    assert_eq!(header(&r, "accept-ranges"), "bytes");
    let whole = r.bytes().unwrap().to_vec();
    let info = probe(&whole);
    assert_eq!((info.video_codec.as_str(), info.width, info.height, info.frames), ("h264", 192, 160, 100));
    assert_eq!(info.audio_codec.as_deref(), Some("aac"));
    assert!((info.duration_s - 4.0).abs() < 0.05, "{}", info.duration_s);
    assert_eq!(files_in(jobs_dir.path()), vec![jobs_dir.path().join(format!("{id}.mp4"))]);
    assert!(s.temp_entries().is_empty(), "{:?}", s.temp_entries());

    let len = whole.len();
    let range =
        |spec: &str| client().get(s.url(&format!("/v1/jobs/{id}/result"))).header("range", spec).send().unwrap();
    let r = range("bytes=0-99");
    assert_eq!(r.status(), 206);
    assert_eq!(header(&r, "content-range"), format!("bytes 0-99/{len}"));
    assert_eq!(r.bytes().unwrap()[..], whole[..100]);
    let r = range("bytes=-300");
    assert_eq!(r.status(), 206);
    assert_eq!(header(&r, "content-range"), format!("bytes {}-{}/{len}", len - 300, len - 1));
    assert_eq!(r.bytes().unwrap()[..], whole[len - 300..]);
    let r = range(&format!("bytes={len}-"));
    assert_eq!(r.status(), 416);
    assert_eq!(header(&r, "content-range"), format!("bytes */{len}"));

    assert_eq!(metric(&s, "cadence_jobs{state=\"done\"}"), 1.0);
    // A finished job is forgotten with its file.
    assert_eq!(client().delete(s.url(&format!("/v1/jobs/{id}"))).send().unwrap().status(), 204);
    assert_eq!(get(&s, &format!("/v1/jobs/{id}")).status(), 404);
    assert_eq!(get(&s, &format!("/v1/jobs/{id}/result")).status(), 404);
    assert!(files_in(jobs_dir.path()).is_empty());
    assert_eq!(metric(&s, "cadence_jobs{state=\"done\"}"), 0.0);
}

#[test]
fn cancelling_jobs_stops_the_render_frees_the_slot_and_removes_their_files() {
    let _r = render_lock();
    let jobs_dir = tempfile::tempdir().unwrap();
    let s = start(&["--slots", "1", "--queue", "0", "--jobs-dir", jobs_dir.path().to_str().unwrap()]);
    let long = || {
        form(long_clip(), &[("stride", "1"), ("face_box", "center")])
            .part("video", part(png(128, 128), "a.png", "image/png"))
    };
    let running = post_job(&s, long());
    wait_for(Duration::from_secs(90), || job(&s, &running)["frames_done"].as_u64().unwrap() > 0);
    // Jobs wait for the slot in the job table, not in the request queue (which is 0 here).
    let queued = post_job(&s, long());
    assert_eq!(job(&s, &queued)["state"], "queued");
    let r = client().delete(s.url(&format!("/v1/jobs/{queued}"))).send().unwrap();
    assert_eq!(r.status(), 202);
    let v = wait_state(&s, &queued, "cancelled", Duration::from_secs(5));
    assert_eq!((v["frames_done"].as_u64(), &v["running_seconds"]), (Some(0), &serde_json::Value::Null));
    assert_eq!(job(&s, &running)["state"], "running", "cancelling the queued job left the running one alone");

    let t = Instant::now();
    let r = client().delete(s.url(&format!("/v1/jobs/{running}"))).send().unwrap();
    assert_eq!(r.status(), 202);
    let v = wait_state(&s, &running, "cancelled", Duration::from_secs(40));
    eprintln!("the running job stopped {:.2} s after DELETE", t.elapsed().as_secs_f64());
    assert!(v["frames_done"].as_u64().unwrap() < v["frames"].as_u64().unwrap());
    assert_eq!(v["error"]["code"], "cancelled");
    assert_eq!(get(&s, &format!("/v1/jobs/{running}/result")).status(), 409);
    assert_eq!(metric(&s, "cadence_renders_total{outcome=\"cancelled\"}"), 1.0);
    assert_eq!(metric(&s, "cadence_renders_running"), 0.0);
    // No result, no temporary beside it, no request directory.
    assert!(files_in(jobs_dir.path()).is_empty(), "{:?}", files_in(jobs_dir.path()));
    wait_for(Duration::from_secs(5), || s.temp_entries().is_empty());
    // The slot is free: with no queue, a busy slot would answer 429.
    let r = client().post(s.url("/generate")).multipart(form(tone_wav(0.2), &[])).send().unwrap();
    assert_eq!(r.status(), 200);
    assert_eq!(metric(&s, "cadence_jobs{state=\"cancelled\"}"), 2.0);
}

#[test]
fn finished_jobs_expire_and_the_table_is_bounded() {
    let _r = render_lock();
    let jobs_dir = tempfile::tempdir().unwrap();
    let s = start(&["--job-ttl-seconds", "1.5", "--max-jobs", "2", "--jobs-dir", jobs_dir.path().to_str().unwrap()]);
    let short =
        || form(tone_wav(0.2), &[("face_box", "center")]).part("video", part(png(128, 128), "a.png", "image/png"));
    let a = post_job(&s, short());
    let b = post_job(&s, short());
    let r = client().post(s.url("/v1/jobs")).multipart(short()).send().unwrap();
    assert_eq!(r.status(), 429);
    assert!(header(&r, "retry-after").parse::<u64>().unwrap() >= 1);
    assert_eq!(error_code(r), "too_many_jobs");
    // A streamed render needs a record too.
    let r = client().post(s.url("/generate?stream=fmp4")).multipart(short()).send().unwrap();
    assert_eq!((r.status().as_u16(), error_code(r).as_str()), (429, "too_many_jobs"));
    assert_eq!(metric(&s, "cadence_rejections_total{reason=\"too_many_jobs\"}"), 2.0);
    let t_done = Instant::now();
    for id in [&a, &b] {
        wait_state(&s, id, "done", Duration::from_secs(30));
        assert!(jobs_dir.path().join(format!("{id}.mp4")).exists(), "a done job's MP4 is kept until it expires");
    }
    // Gone (record and file) within the TTL plus a sweep or two after finishing.
    wait_for(Duration::from_secs(10), || get(&s, &format!("/v1/jobs/{a}")).status() == 404);
    wait_for(Duration::from_secs(5), || get(&s, &format!("/v1/jobs/{b}")).status() == 404);
    assert!(t_done.elapsed() >= Duration::from_millis(1400), "expired before the TTL: {:?}", t_done.elapsed());
    assert!(files_in(jobs_dir.path()).is_empty());
    post_job(&s, short());
}

#[test]
fn anything_that_is_not_a_job_id_is_refused_and_bad_jobs_leave_no_record() {
    let s = start(&[]);
    let c = client();
    for bad in ["not-an-id", "..%2F..%2Fetc%2Fpasswd", "%2E%2E%2Fx", &"A".repeat(32), &"a".repeat(31), &"a".repeat(64)]
    {
        for suffix in ["", "/result", "/events"] {
            let r = get(&s, &format!("/v1/jobs/{bad}{suffix}"));
            assert_eq!((r.status().as_u16(), error_code(r).as_str()), (400, "invalid_job_id"), "{bad}{suffix}");
        }
        let r = c.delete(s.url(&format!("/v1/jobs/{bad}"))).send().unwrap();
        assert_eq!(r.status(), 400, "{bad}");
    }
    let unknown = "0".repeat(32);
    for suffix in ["", "/result", "/events"] {
        let r = get(&s, &format!("/v1/jobs/{unknown}{suffix}"));
        assert_eq!((r.status().as_u16(), error_code(r).as_str()), (404, "job_not_found"), "{suffix}");
    }
    // Bodies are checked before a record exists.
    let r = c.post(s.url("/v1/jobs")).multipart(form(b"RIFF\0\0\0\0WAVEjunk".to_vec(), &[])).send().unwrap();
    assert_eq!((r.status().as_u16(), error_code(r).as_str()), (422, "invalid_audio"));
    let r = c.post(s.url("/v1/jobs?stream=fmp4")).multipart(form(tone_wav(0.2), &[])).send().unwrap();
    assert_eq!((r.status().as_u16(), error_code(r).as_str()), (422, "unknown_parameter"));
    let r = c.post(s.url("/v1/jobs")).header("content-type", "text/plain").body("x").send().unwrap();
    assert_eq!(r.status(), 415);
    for state in ["queued", "running", "done", "failed", "cancelled"] {
        assert_eq!(metric(&s, &format!("cadence_jobs{{state=\"{state}\"}}")), 0.0, "{state}");
    }
    assert_eq!(metric(&s, "cadence_avatar_preparations_total"), 0.0);
    assert!(s.temp_entries().is_empty());
}

/// A streamed render's statistics, known only after its headers, land in its job record.
#[test]
fn a_streamed_render_records_its_final_statistics() {
    let _r = render_lock();
    let s = start(&[]);
    let f = form(tone_wav(0.4), &[("stride", "2"), ("face_box", "center")])
        .part("video", part(png(128, 96), "a.png", "image/png"));
    let r = client().post(s.url("/generate?stream=fmp4")).multipart(f).send().unwrap();
    assert_eq!(r.status(), 200);
    let id = header(&r, "x-job-id").to_string();
    let body = r.bytes().unwrap();
    assert!(!body.is_empty());
    let v = wait_state(&s, &id, "done", Duration::from_secs(5));
    assert_eq!(
        (v["kind"].as_str(), v["frames"].as_u64(), v["frames_done"].as_u64()),
        (Some("stream"), Some(10), Some(10))
    );
    let stats = &v["stats"];
    assert_eq!((stats["frames"].as_u64(), stats["stride"].as_u64()), (Some(10), Some(2)));
    assert!(stats["inference_fps"].as_f64().unwrap() > 0.0);
    assert!(stats["first_fragment_ms"].as_f64().unwrap() > 0.0);
    assert!(stats["bytes"].as_u64().unwrap() > 0);
    for stage in ["queue;dur=", "unet;dur=", "render;dur="] {
        assert!(stats["server_timing"].as_str().unwrap().contains(stage), "{stats}");
    }
    let r = get(&s, &format!("/v1/jobs/{id}/result"));
    assert_eq!((r.status().as_u16(), error_code(r).as_str()), (404, "no_result"));
}
