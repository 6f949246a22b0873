//! `cadence serve` over real HTTP: renders, streamed renders, limits, auth, admission,
//! cancellation, avatars, metrics, the OpenAPI document and shutdown. Renders take a shared lock
//! (two cores; several tests measure timing-dependent behaviour).

mod common;

use base64::Engine as _;
use common::*;
use std::io::Cursor;
use std::time::{Duration, Instant};

#[test]
fn generate_multipart_returns_an_mp4_whose_headers_match_it() {
    let _r = render_lock();
    let s = start(&[]);
    let audio = std::fs::read(fixture("goodnight")).unwrap();
    let f =
        // The synthetic portrait has no face for the detector: the centred box.
        form(audio, &[("stride", "3"), ("decoder", "taesd"), ("face_box", "center")])
            .part("video", part(png(192, 160), "a.png", "image/png"));
    let r = client().post(s.url("/generate")).multipart(f).send().unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text());
    assert_eq!(header(&r, "content-type"), "video/mp4");
    assert!(!header(&r, "x-request-id").is_empty());
    assert_eq!(header(&r, "x-stride"), "3");
    let frames: u64 = header(&r, "x-frames").parse().unwrap();
    let fps: f64 = header(&r, "x-inference-fps").parse().unwrap();
    let rtf = header(&r, "x-realtime-factor").strip_suffix('x').unwrap().parse::<f64>().unwrap();
    assert!(fps > 0.0 && (rtf - fps / 25.0).abs() < 0.006, "fps {fps}, realtime factor {rtf}");
    assert!(header(&r, "x-inference-fps").split('.').nth(1).is_some_and(|d| d.len() == 2));
    let evaluated: u64 = header(&r, "x-keyframes-evaluated").parse().unwrap();
    let bypassed: u64 = header(&r, "x-bypassed-frames").parse().unwrap();
    // 2.0 s at 25 fps; stride 3 schedules ceil(51 / 3) + the last frame, minus bypassed ones.
    assert_eq!(frames, 51);
    assert!(evaluated > 0 && evaluated <= 18 && bypassed < frames, "{evaluated} {bypassed}");
    assert!(header(&r, "x-weights").starts_with("synthetic"));
    let timing = header(&r, "server-timing").to_string();
    for stage in
        ["upload;dur=", "validate;dur=", "queue;dur=", "avatar;dur=", "unet;dur=", "decoder;dur=", "encoder;dur="]
    {
        assert!(timing.contains(stage), "{timing}");
    }
    assert!(timing.contains("desc=\"prepared\""), "{timing}");
    let body = r.bytes().unwrap();
    let info = probe(&body);
    assert_eq!((info.video_codec.as_str(), info.width, info.height, info.frames), ("h264", 192, 160, frames));
    assert_eq!(info.audio_codec.as_deref(), Some("aac"));
    assert!(s.temp_entries().is_empty(), "{:?}", s.temp_entries());
    assert_eq!(metric(&s, "cadence_renders_total{outcome=\"ok\"}"), 1.0);
}

#[test]
fn generate_json_variant_renders_the_bundled_avatar() {
    let _r = render_lock();
    let s = start(&[]);
    let b64 = base64::engine::general_purpose::STANDARD.encode(tone_wav(0.4));
    let body = serde_json::json!({"audio_b64": b64, "stride": 2, "decoder": "taesd", "ramp": 2});
    let r = client()
        .post(s.url("/generate"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text());
    assert_eq!((header(&r, "x-stride"), header(&r, "x-frames")), ("2", "10"));
    let info = probe(&r.bytes().unwrap());
    // No avatar sent: the bundled anchor portrait.
    assert_eq!((info.width, info.height, info.frames), (1080, 1920, 10));
    assert!(info.has_audio);
}

#[test]
fn generate_with_image_infill_decodes_the_keyframes_only() {
    let _r = render_lock();
    let s = start(&[]);
    let c = client();
    let audio = std::fs::read(fixture("goodnight")).unwrap();
    let render = |infill: &str| {
        let f = form(audio.clone(), &[("stride", "3"), ("face_box", "center"), ("infill", infill)])
            .part("video", part(png(192, 160), "a.png", "image/png"));
        let r = c.post(s.url("/generate")).multipart(f).send().unwrap();
        assert_eq!(r.status(), 200, "{infill}: {:?}", r.text());
        let n = |name: &str| header(&r, name).parse::<u64>().unwrap();
        let counts = (n("x-frames"), n("x-keyframes-evaluated"), n("x-bypassed-frames"), n("x-decoded-frames"));
        assert_eq!(probe(&r.bytes().unwrap()).frames, counts.0, "{infill}");
        counts
    };
    let (frames, evaluated, bypassed, decoded_latent) = render("latent");
    let image = render("image");
    // The same schedule and silence; latent decodes every frame not bypassed, image the UNet's
    // keyframes only.
    assert_eq!((image.0, image.1, image.2), (frames, evaluated, bypassed));
    assert_eq!(decoded_latent, frames - bypassed);
    assert_eq!(image.3, evaluated);
    assert!(image.3 < decoded_latent, "image {image:?}, latent decoded {decoded_latent}");

    // The JSON variant takes it too; a bad value is refused, and an avatar takes none.
    let b64 = base64::engine::general_purpose::STANDARD.encode(tone_wav(0.4));
    let body = serde_json::json!({"audio_b64": b64, "stride": 2, "infill": "image"});
    let r =
        c.post(s.url("/generate")).header("content-type", "application/json").body(body.to_string()).send().unwrap();
    assert_eq!(r.status(), 200, "{:?}", r.text());
    assert_eq!(header(&r, "x-decoded-frames"), header(&r, "x-keyframes-evaluated"));
    let r = c.post(s.url("/generate")).multipart(form(tone_wav(0.3), &[("infill", "pixels")])).send().unwrap();
    assert_eq!(r.status(), 422);
    let e: serde_json::Value = r.json().unwrap();
    assert_eq!(e["error"]["code"], "invalid_option");
    assert_eq!(e["error"]["message"], "infill: 'pixels': expected latent or image");
    let f = reqwest::blocking::multipart::Form::new()
        .part("image", part(png(160, 128), "me.png", "image/png"))
        .text("face_box", "center")
        .text("infill", "image");
    let r = c.post(s.url("/v1/avatars")).multipart(f).send().unwrap();
    assert_eq!((r.status().as_u16(), error_code(r).as_str()), (422, "unknown_field"));
}

/// An image within --max-pixels whose sides the H.264 encoder cannot take (2880x2880: both
/// over 2160) is a 422 that names the encoder's limit, before any engine runs (it was a 500
/// from the encoder after the render's work).
#[test]
fn an_avatar_larger_than_the_encoder_takes_is_422_before_any_engine_work() {
    let s = start(&[]);
    let mut big = Cursor::new(Vec::new());
    image::RgbImage::new(2880, 2880).write_to(&mut big, image::ImageFormat::Png).unwrap();
    let f = form(tone_wav(0.3), &[]).part("video", part(big.into_inner(), "big.png", "image/png"));
    let r = client().post(s.url("/generate")).multipart(f).send().unwrap();
    assert_eq!(r.status(), 422);
    let v: serde_json::Value = r.json().unwrap();
    assert_eq!(v["error"]["code"], "invalid_image");
    let message = v["error"]["message"].as_str().unwrap();
    assert!(message.contains("2880x2880") && message.contains("at most 3840x2160 or 2160x3840"), "{message}");
    assert_eq!(metric(&s, "cadence_avatar_preparations_total"), 0.0);
    assert_eq!(metric(&s, "cadence_rendered_frames_total"), 0.0);
}

#[test]
fn limits_refuse_before_any_engine_work() {
    let s = start(&["--max-body-mb", "1", "--max-seconds", "3", "--max-pixels", "100000"]);
    let c = client();
    let post = |f: reqwest::blocking::multipart::Form| c.post(s.url("/generate")).multipart(f).send().unwrap();
    let expect = |r: reqwest::blocking::Response, status: u16, code: &str| {
        assert_eq!(r.status(), status);
        assert!(r.headers().contains_key("x-request-id"));
        assert_eq!(error_code(r), code);
    };
    // 413: a body over --max-body-mb, declared (multipart) or streamed (chunked JSON).
    expect(post(form(vec![0u8; 1_200_000], &[])), 413, "payload_too_large");
    let big = format!("{{\"audio_b64\": \"{}\"}}", "A".repeat(1_300_000));
    // A reader of unknown length: sent chunked, so only the count while streaming can refuse it.
    let chunked = reqwest::blocking::Body::new(std::io::Cursor::new(big.into_bytes()));
    let r = c.post(s.url("/generate")).header("content-type", "application/json").body(chunked).send().unwrap();
    expect(r, 413, "payload_too_large");
    // A multipart file of unknown length: counted while it streams to disk.
    let streamed =
        reqwest::blocking::multipart::Part::reader(std::io::Cursor::new(vec![7u8; 1_200_000])).file_name("a.wav");
    expect(post(reqwest::blocking::multipart::Form::new().part("audio", streamed)), 413, "payload_too_large");
    // 415: neither multipart nor JSON.
    expect(
        c.post(s.url("/generate")).header("content-type", "text/plain").body("hi").send().unwrap(),
        415,
        "unsupported_media_type",
    );
    expect(c.post(s.url("/generate")).body("hi").send().unwrap(), 415, "unsupported_media_type");
    // 422: what cannot be rendered.
    let ok = tone_wav(0.3);
    expect(post(form(b"RIFF\0\0\0\0WAVEjunk".to_vec(), &[])), 422, "invalid_audio");
    expect(post(form(nan_wav(), &[])), 422, "invalid_audio");
    expect(post(form(tone_wav(3.5), &[])), 422, "audio_too_long");
    expect(post(form(ok.clone(), &[("stride", "0")])), 422, "invalid_option");
    expect(post(form(ok.clone(), &[("decoder", "vqgan")])), 422, "invalid_option");
    expect(post(form(ok.clone(), &[("keyframes", "0,5,3")])), 422, "invalid_keyframes");
    expect(post(form(ok.clone(), &[("strides", "2")])), 422, "unknown_field");
    expect(post(reqwest::blocking::multipart::Form::new().text("stride", "2")), 422, "missing_field");
    expect(post(form(Vec::new(), &[])), 422, "empty_field");
    let with_image = |img: Vec<u8>| form(ok.clone(), &[]).part("video", part(img, "a.png", "image/png"));
    expect(post(with_image(png(400, 300))), 422, "image_too_large");
    expect(post(with_image(png(129, 128))), 422, "invalid_image");
    expect(post(with_image(b"\x89PNG\r\n\x1a\nnot really".to_vec())), 422, "invalid_image");
    expect(post(form(ok.clone(), &[("avatar_id", "../../etc/passwd")])), 422, "invalid_avatar_id");
    expect(post(form(ok.clone(), &[("avatar_id", &"ab".repeat(32))])), 404, "avatar_not_found");
    let json = |v: serde_json::Value| {
        c.post(s.url("/generate")).header("content-type", "application/json").body(v.to_string()).send().unwrap()
    };
    expect(json(serde_json::json!({"audio_b64": "%%%"})), 422, "invalid_base64");
    expect(json(serde_json::json!({"audio": "x"})), 422, "invalid_json");
    // None of it reached an engine.
    assert_eq!(metric(&s, "cadence_avatar_preparations_total"), 0.0);
    assert_eq!(metric(&s, "cadence_rendered_frames_total"), 0.0);
    assert!(metric(&s, "cadence_rejections_total{reason=\"invalid\"}") >= 14.0);
    assert!(s.temp_entries().is_empty(), "{:?}", s.temp_entries());
}

#[test]
fn a_token_guards_every_route_but_the_probes_and_stale_temp_dirs_are_swept() {
    let temp = tempfile::tempdir().unwrap();
    // Left by a server that was killed (no process has this pid): swept at start.
    let stale = temp.path().join("req-99999999-x");
    std::fs::create_dir(&stale).unwrap();
    let s = start_with(&["--token", "s3cret"], false, temp);
    assert!(!stale.exists());
    let c = client();
    for open in ["/healthz", "/readyz"] {
        assert_eq!(get(&s, open).status(), 200, "{open}");
    }
    for path in ["/v1/info", "/metrics", "/openapi.json", "/v1/avatars/0"] {
        let r = get(&s, path);
        assert_eq!(r.status(), 401, "{path}");
        assert_eq!(header(&r, "www-authenticate"), "Bearer");
        assert_eq!(error_code(r), "unauthorized");
        assert_eq!(c.get(s.url(path)).bearer_auth("wrong").send().unwrap().status(), 401, "{path}");
    }
    let r = c.post(s.url("/generate")).multipart(form(tone_wav(0.2), &[])).send().unwrap();
    assert_eq!(r.status(), 401);
    // The scheme's name is case-insensitive (RFC 9110); the token is not.
    for scheme in ["bearer", "BEARER"] {
        let r = c.get(s.url("/v1/info")).header("authorization", format!("{scheme} s3cret")).send().unwrap();
        assert_eq!(r.status(), 200, "{scheme}");
    }
    let r = c.get(s.url("/v1/info")).header("authorization", "Bearer S3CRET").send().unwrap();
    assert_eq!(r.status(), 401);
    let r = c.get(s.url("/v1/info")).bearer_auth("s3cret").send().unwrap();
    assert_eq!(r.status(), 200);
    let info: serde_json::Value = r.json().unwrap();
    assert_eq!(info["engines"]["profile"], "cpu-reduced");
    assert!(info["engines"]["weights"].as_str().unwrap().starts_with("synthetic"));
    assert!(info["engines"]["device"].as_str().unwrap().starts_with("cpu"));
}

/// Starts a render of the long clip that the client abandons after `client_timeout`.
fn abandoned_render(s: &TestServer, client_timeout: Duration) -> std::thread::JoinHandle<reqwest::Result<u16>> {
    let url = s.url("/generate");
    let f = form(long_clip(), &[("stride", "1"), ("face_box", "center")])
        .part("video", part(png(128, 128), "a.png", "image/png"));
    let h = std::thread::spawn(move || {
        let c = reqwest::blocking::Client::builder().timeout(client_timeout).build().unwrap();
        c.post(url).multipart(f).send().map(|r| r.status().as_u16())
    });
    wait_for(Duration::from_secs(30), || metric(s, "cadence_renders_running") == 1.0);
    h
}

#[test]
fn a_request_waits_in_the_queue_and_beyond_it_429_with_retry_after() {
    let _r = render_lock();
    let s = start(&["--slots", "1", "--queue", "1"]);
    let long = abandoned_render(&s, Duration::from_secs(6));
    // The queue has room for one: it waits for the slot.
    let url = s.url("/generate");
    let f = form(tone_wav(0.3), &[("face_box", "center")]).part("video", part(png(128, 128), "a.png", "image/png"));
    let queued = std::thread::spawn(move || {
        let r = client().post(url).multipart(f).send().unwrap();
        (r.status().as_u16(), header(&r, "server-timing").to_string())
    });
    wait_for(Duration::from_secs(10), || metric(&s, "cadence_queue_depth") == 1.0);
    // Slot and queue full.
    let r = client().post(s.url("/generate")).multipart(form(tone_wav(0.3), &[])).send().unwrap();
    assert_eq!(r.status(), 429);
    let retry: u64 = header(&r, "retry-after").parse().unwrap();
    assert!(retry >= 1);
    assert_eq!(error_code(r), "queue_full");
    assert_eq!(metric(&s, "cadence_rejections_total{reason=\"queue_full\"}"), 1.0);
    assert!(long.join().unwrap().is_err(), "the long render should still be running when its client gives up");
    // The abandoned render frees the slot; the queued request gets it.
    let (status, timing) = queued.join().unwrap();
    assert_eq!(status, 200);
    let queue_ms: f64 = timing.split("queue;dur=").nth(1).unwrap().split(',').next().unwrap().parse().unwrap();
    assert!(queue_ms > 1000.0, "{timing}");
    assert_eq!(metric(&s, "cadence_queue_depth"), 0.0);
}

#[test]
fn a_client_that_disconnects_cancels_its_render_frees_the_slot_and_leaves_no_files() {
    let _r = render_lock();
    let s = start(&["--slots", "1", "--queue", "0"]);
    let t = Instant::now();
    let long = abandoned_render(&s, Duration::from_secs(4));
    assert!(!s.temp_entries().is_empty(), "the render's directory exists while it runs");
    assert!(long.join().unwrap().is_err());
    // The render stops at its next engine batch: well before the ~60 s it would take.
    wait_for(Duration::from_secs(20), || metric(&s, "cadence_renders_total{outcome=\"cancelled\"}") == 1.0);
    // The outcome is counted inside the slot, just before the slot is released.
    wait_for(Duration::from_secs(2), || metric(&s, "cadence_renders_running") == 0.0);
    assert!(t.elapsed() < Duration::from_secs(30), "{:?}", t.elapsed());
    wait_for(Duration::from_secs(5), || s.temp_entries().is_empty());
    assert_eq!(metric(&s, "cadence_renders_total{outcome=\"ok\"}"), 0.0);
    assert_eq!(metric(&s, "cadence_http_requests_total{route=\"/generate\",status=\"499\"}"), 1.0);
}

#[test]
fn a_registered_avatar_is_prepared_once_and_reused() {
    let _r = render_lock();
    let s = start(&[]);
    let c = client();
    let register = || {
        let f = reqwest::blocking::multipart::Form::new()
            .part("image", part(png(160, 128), "me.png", "image/png"))
            .text("face_box", "center");
        c.post(s.url("/v1/avatars")).multipart(f).send().unwrap()
    };
    let r = register();
    assert_eq!(r.status(), 201);
    let v: serde_json::Value = r.json().unwrap();
    let id = v["avatar_id"].as_str().unwrap().to_string();
    assert_eq!((id.len(), v["status"].as_str()), (64, Some("ready")));
    // The same file again: the same id, nothing prepared.
    let r = register();
    assert_eq!(r.status(), 200);
    assert_eq!(r.json::<serde_json::Value>().unwrap()["avatar_id"], id.as_str());
    assert_eq!(metric(&s, "cadence_avatar_preparations_total"), 1.0);
    assert_eq!(get(&s, &format!("/v1/avatars/{id}")).json::<serde_json::Value>().unwrap()["width"], 160);
    for _ in 0..2 {
        let r = c.post(s.url("/generate")).multipart(form(tone_wav(0.3), &[("avatar_id", &id)])).send().unwrap();
        assert_eq!(r.status(), 200);
        assert!(header(&r, "server-timing").contains("avatar;dur="), "{}", header(&r, "server-timing"));
        assert!(header(&r, "server-timing").contains("desc=\"cached\""));
        assert_eq!(probe(&r.bytes().unwrap()).width, 160);
    }
    assert_eq!(metric(&s, "cadence_avatar_preparations_total"), 1.0);
    assert_eq!(metric(&s, "cadence_avatar_cache_hits_total"), 2.0);
    assert_eq!(c.delete(s.url(&format!("/v1/avatars/{id}"))).send().unwrap().status(), 204);
    assert_eq!(get(&s, &format!("/v1/avatars/{id}")).status(), 404);
    assert_eq!(error_code(get(&s, "/v1/avatars/not-an-id")), "invalid_avatar_id");
    let r = c.post(s.url("/generate")).multipart(form(tone_wav(0.3), &[("avatar_id", &id)])).send().unwrap();
    assert_eq!(r.status(), 404);
}

/// A strict reader of the Prometheus text format (0.0.4): every sample belongs to a family
/// declared by `# TYPE` before it, names and labels are well formed, values are numbers.
fn parse_prometheus(text: &str) -> Vec<(String, String, f64)> {
    let name_ok = |n: &str| {
        !n.is_empty()
            && n.chars().next().is_some_and(|c| c.is_ascii_alphabetic() || c == '_' || c == ':')
            && n.chars().all(|c| c.is_ascii_alphanumeric() || c == '_' || c == ':')
    };
    let mut families: Vec<String> = Vec::new();
    let mut histograms: Vec<String> = Vec::new();
    let mut samples = Vec::new();
    for line in text.lines().filter(|l| !l.is_empty()) {
        if let Some(rest) = line.strip_prefix("# TYPE ") {
            let (name, kind) = rest.split_once(' ').unwrap();
            assert!(name_ok(name) && ["counter", "gauge", "histogram", "summary", "untyped"].contains(&kind), "{line}");
            assert!(!families.contains(&name.to_string()), "family {name} declared twice");
            families.push(name.to_string());
            if kind == "histogram" {
                histograms.push(name.to_string());
            }
            continue;
        }
        if line.starts_with("# HELP ") {
            continue;
        }
        assert!(!line.starts_with('#'), "unexpected comment: {line}");
        let (series, value) = line.rsplit_once(' ').unwrap();
        let value: f64 = match value {
            "NaN" => f64::NAN,
            "+Inf" => f64::INFINITY,
            "-Inf" => f64::NEG_INFINITY,
            v => v.parse().unwrap_or_else(|_| panic!("bad value in {line}")),
        };
        let (name, labels) = match series.split_once('{') {
            Some((n, l)) => (n, l.strip_suffix('}').unwrap_or_else(|| panic!("unclosed labels: {line}"))),
            None => (series, ""),
        };
        assert!(name_ok(name), "{line}");
        // A histogram's samples are its family's name with _bucket (labelled le), _sum or _count.
        let histogram = |suffix: &str| {
            name.strip_suffix(suffix).is_some_and(|f| histograms.iter().any(|h| h == f))
                && (suffix == "_bucket") == labels.contains("le=\"")
        };
        assert!(
            families.iter().any(|f| f == name) || ["_bucket", "_sum", "_count"].into_iter().any(histogram),
            "{name} has no # TYPE before it"
        );
        if !labels.is_empty() {
            for pair in labels.split("\",").map(|p| p.trim_end_matches('"')) {
                let (k, v) = pair.split_once("=\"").unwrap_or_else(|| panic!("bad label in {line}"));
                assert!(name_ok(k) && !v.contains('\n'), "{line}");
            }
        }
        samples.push((name.to_string(), labels.to_string(), value));
    }
    samples
}

#[test]
fn metrics_parse_as_prometheus_text() {
    let s = start(&[]);
    // A client's own request id comes back (and is the one in the log).
    let r = client().get(s.url("/healthz")).header("x-request-id", "client-42").send().unwrap();
    assert_eq!(header(&r, "x-request-id"), "client-42");
    get(&s, "/no/such/route");
    let r = get(&s, "/metrics");
    assert!(header(&r, "content-type").starts_with("text/plain; version=0.0.4"));
    let samples = parse_prometheus(&r.text().unwrap());
    let find = |name: &str, labels: &str| samples.iter().find(|(n, l, _)| n == name && l == labels).map(|s| s.2);
    assert_eq!(find("cadence_http_requests_total", "route=\"/healthz\",status=\"200\""), Some(1.0));
    assert_eq!(find("cadence_http_requests_total", "route=\"unmatched\",status=\"404\""), Some(1.0));
    assert_eq!(find("cadence_ready", ""), Some(1.0));
    assert_eq!(find("cadence_render_slots", ""), Some(1.0));
    for family in
        ["cadence_queue_depth", "cadence_renders_running", "cadence_render_fps", "cadence_avatar_preparations_total"]
    {
        assert!(find(family, "").is_some(), "{family}");
    }
    // The time-to-first-byte histogram: cumulative buckets up to +Inf, which equals the count.
    let ttfb = "cadence_time_to_first_byte_seconds";
    let buckets: Vec<f64> =
        samples.iter().filter(|(n, _, _)| *n == format!("{ttfb}_bucket")).map(|(_, _, v)| *v).collect();
    assert!(buckets.len() >= 2 && buckets.windows(2).all(|w| w[0] <= w[1]), "{buckets:?}");
    assert_eq!(find(&format!("{ttfb}_bucket"), "le=\"+Inf\""), Some(0.0));
    assert_eq!(find(&format!("{ttfb}_count"), ""), Some(0.0));
    assert_eq!(find(&format!("{ttfb}_sum"), ""), Some(0.0));
}

#[test]
fn openapi_lists_every_route_and_the_router_serves_each() {
    let s = start(&[]);
    let doc: serde_json::Value = get(&s, "/openapi.json").json().unwrap();
    assert_eq!(doc["openapi"], "3.1.0");
    let paths = doc["paths"].as_object().unwrap();
    let operations: usize = paths.values().map(|p| p.as_object().unwrap().len()).sum();
    assert_eq!(operations, cadence_server::openapi::ROUTES.len());
    // The probes need no token; the rest may answer 401.
    assert_eq!(doc["paths"]["/readyz"]["get"]["security"], serde_json::json!([]));
    assert!(doc["paths"]["/generate"]["post"]["responses"]["401"].is_object());
    assert!(doc["paths"]["/generate"]["post"]["requestBody"]["content"]["application/json"].is_object());
    let stream = &doc["paths"]["/generate"]["post"]["parameters"][0];
    assert_eq!((&stream["name"], &stream["in"]), (&serde_json::json!("stream"), &serde_json::json!("query")));
    assert_eq!(stream["schema"]["enum"], serde_json::json!(["fmp4"]));
    let c = client();
    let id = "ab".repeat(32);
    for r in cadence_server::openapi::ROUTES {
        assert!(doc["paths"][r.path][r.method]["responses"].is_object(), "{} {}", r.method, r.path);
        // A calibration out of bounds: the route answers without running one.
        let query = if r.path == "/calibrate" { "?runs=0" } else { "" };
        let url = s.url(&format!("{}{query}", r.path.replace("{id}", &id)));
        let resp = match r.method {
            "get" => c.get(url),
            "post" => c.post(url),
            "delete" => c.delete(url),
            m => panic!("method {m}"),
        }
        .send()
        .unwrap();
        let status = resp.status().as_u16();
        let code = if status >= 400 { error_code(resp) } else { String::new() };
        assert!(code != "no_route" && code != "method_not_allowed", "{} {}: {status} {code}", r.method, r.path);
    }
    let r = c.put(s.url("/generate")).send().unwrap();
    assert_eq!((r.status().as_u16(), error_code(r).as_str()), (405, "method_not_allowed"));
}

#[test]
fn readyz_is_503_until_the_engines_have_loaded() {
    let _r = render_lock();
    let s = start_with(&[], true, tempfile::tempdir().unwrap());
    assert_eq!(get(&s, "/healthz").status(), 200);
    let r = get(&s, "/readyz");
    assert_eq!(r.status(), 503, "the engines take seconds to load");
    assert!(r.headers().contains_key("retry-after"));
    assert_eq!(error_code(r), "loading");
    let r = client().post(s.url("/generate")).multipart(form(tone_wav(0.2), &[])).send().unwrap();
    assert_eq!((r.status().as_u16(), error_code(r).as_str()), (503, "loading"));
    wait_for(Duration::from_secs(120), || get(&s, "/readyz").status() == 200);
}

#[test]
fn shutdown_drains_an_in_flight_render() {
    let _r = render_lock();
    let mut s = start(&["--drain-seconds", "120"]);
    let url = s.url("/generate");
    let f = form(std::fs::read(fixture("goodnight")).unwrap(), &[("stride", "2"), ("face_box", "center")])
        .part("video", part(png(128, 128), "a.png", "image/png"));
    let h = std::thread::spawn(move || {
        let r = client().post(url).multipart(f).send().unwrap();
        (r.status().as_u16(), r.bytes().unwrap())
    });
    wait_for(Duration::from_secs(30), || metric(&s, "cadence_renders_running") == 1.0);
    s.server.shutdown();
    // Draining: unready, and new renders refused, while the one in flight finishes.
    wait_for(Duration::from_secs(5), || get(&s, "/readyz").status() == 503);
    assert_eq!(error_code(get(&s, "/readyz")), "draining");
    let r = client().post(s.url("/generate")).multipart(form(tone_wav(0.2), &[])).send().unwrap();
    assert_eq!((r.status().as_u16(), error_code(r).as_str()), (503, "draining"));
    let (status, body) = h.join().unwrap();
    assert_eq!(status, 200);
    assert_eq!(probe(&body).frames, 51);
    let t = Instant::now();
    let TestServer { server, temp } = s;
    server.stop().unwrap();
    assert!(t.elapsed() < Duration::from_secs(5), "{:?}", t.elapsed());
    assert_eq!(std::fs::read_dir(temp.path()).unwrap().count(), 0);
}

#[test]
fn shutdown_cancels_renders_that_outlive_the_drain_deadline() {
    let _r = render_lock();
    let mut s = start(&["--drain-seconds", "0.5"]);
    let long = abandoned_render(&s, Duration::from_secs(60));
    let t = Instant::now();
    s.server.shutdown();
    assert_eq!(long.join().unwrap().unwrap(), 503, "cancelled at the deadline");
    let TestServer { server, temp } = s;
    server.stop().unwrap();
    assert!(t.elapsed() < Duration::from_secs(15), "{:?}", t.elapsed());
    assert_eq!(std::fs::read_dir(temp.path()).unwrap().count(), 0);
}

/// The curl examples of server/README.md, run as written against a server, in a directory
/// holding the files they name; then the video avatar's registration against a refusal, which
/// stops the script with the answer shown instead of going on with the error's JSON as the id.
#[test]
fn the_readme_curl_examples_work() {
    if std::process::Command::new("curl").arg("--version").output().is_err() {
        // Counted and listed by scripts/test.sh; .ci/run installs curl.
        skipped("the_readme_curl_examples_work", "no curl on PATH");
        return;
    }
    let _r = render_lock();
    let readme = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/README.md")).unwrap();
    let examples = readme.split("### Examples").nth(1).unwrap();
    let block = examples.split("```sh\n").nth(1).unwrap().split("```").next().unwrap();
    let lines = block.lines().filter(|l| !l.trim().is_empty()).count();
    assert!(block.contains("curl") && lines >= 10, "{block}");
    let s = start(&[]);
    let dir = tempfile::tempdir().unwrap();
    // Three frames: the SD VAE example (full_vae) decodes slowly on the CPU.
    std::fs::write(dir.path().join("speech.wav"), tone_wav(0.12)).unwrap();
    // The examples send portrait.png and avatar.mp4 with no face_box: a real face, which the
    // server finds.
    std::fs::write(dir.path().join("portrait.png"), face_png()).unwrap();
    std::fs::write(dir.path().join("avatar.mp4"), face_video(3)).unwrap();
    assert!(block.starts_with("set -euo pipefail"), "{block}");
    let script = block.replace("http://127.0.0.1:8080", &s.url(""));
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(&script)
        .current_dir(dir.path())
        .env("CADENCE_TOKEN", "not-checked-by-this-server")
        .output()
        .expect("bash and curl");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(out.status.success(), "{}\n{stdout}", String::from_utf8_lossy(&out.stderr));
    assert!(stdout.contains("x-inference-fps:"), "{stdout}");
    assert_eq!(probe(&std::fs::read(dir.path().join("out.mp4")).unwrap()).width, 256);
    let live = cadence_media::Mp4Reader::open(dir.path().join("live.mp4")).unwrap();
    assert!(live.is_fragmented() && live.video_samples().unwrap().samples.len() == 3, "the streamed example");
    // The job's MP4, and its first KiB through a range.
    let job = std::fs::read(dir.path().join("job.mp4")).unwrap();
    assert_eq!(probe(&job).frames, 3);
    assert_eq!(std::fs::read(dir.path().join("head.bin")).unwrap()[..], job[..1024]);
    assert!(stdout.contains("event: done"), "{stdout}");
    // The streamed example's record stays (until it expires); the job's was deleted.
    assert_eq!(metric(&s, "cadence_jobs{state=\"done\"}"), 1.0);
    // The video avatar, sent and then registered: the same render both ways.
    let talk = std::fs::read(dir.path().join("talk.mp4")).unwrap();
    assert_eq!((probe(&talk).width, probe(&talk).frames), (256, 3));
    assert!(std::fs::read(dir.path().join("talk2.mp4")).unwrap() == talk, "the registered video avatar's render");
    // The examples registered two avatars, rendered them, and deleted the image's; the video
    // avatar was prepared twice (sent, then registered) and used once by id.
    assert_eq!(metric(&s, "cadence_avatar_preparations_total"), 8.0);
    assert_eq!(metric(&s, "cadence_avatars"), 1.0);

    // The README's preamble and its video avatar registration, with a file that is no video.
    let preamble: Vec<&str> = block.lines().take_while(|l| !l.starts_with("curl ")).collect();
    let register = block.lines().find(|l| l.starts_with("vid=$(")).unwrap();
    let script = format!("{}\n{register}\necho \"registered $vid\"\n", preamble.join("\n"));
    std::fs::write(dir.path().join("avatar.mp4"), b"not a video").unwrap();
    let out = std::process::Command::new("bash")
        .arg("-c")
        .arg(script.replace("http://127.0.0.1:8080", &s.url("")))
        .current_dir(dir.path())
        .output()
        .expect("bash and curl");
    let (stdout, stderr) = (String::from_utf8_lossy(&out.stdout), String::from_utf8_lossy(&out.stderr));
    assert!(!out.status.success() && !stdout.contains("registered"), "went on after a refusal: {stdout}");
    assert!(stderr.contains("\"code\":\"invalid_"), "the refusal is not shown: {stderr}");
}

#[test]
fn two_slots_render_two_requests_at_once_without_mixing_them() {
    let _r = render_lock();
    let s = start(&["--slots", "2", "--queue", "0"]);
    let send = |seconds: f64| {
        let url = s.url("/generate");
        let f = form(tone_wav(seconds), &[("stride", "2"), ("face_box", "center")])
            .part("video", part(png(128, 128), "a.png", "image/png"));
        std::thread::spawn(move || {
            let r = client().post(url).multipart(f).send().unwrap();
            assert_eq!(r.status(), 200);
            r.bytes().unwrap().to_vec()
        })
    };
    let (a, b) = (send(0.4), send(0.6));
    let (a, b) = (a.join().unwrap(), b.join().unwrap());
    assert_eq!((probe(&a).frames, probe(&b).frames), (10, 15));
    // The same request alone gives the same bytes: nothing leaked between the two renders.
    assert!(send(0.4).join().unwrap() == a, "a render shared with another differs from the same render alone");
    assert_eq!(metric(&s, "cadence_rejections_total{reason=\"queue_full\"}"), 0.0);
}

/// Writes a streamed body to a file and opens it with the media crate's reader.
fn read_back(body: &[u8]) -> (tempfile::TempDir, cadence_media::Mp4Reader) {
    let dir = tempfile::tempdir().unwrap();
    let p = dir.path().join("live.mp4");
    std::fs::write(&p, body).unwrap();
    let r = cadence_media::Mp4Reader::open(&p).unwrap();
    (dir, r)
}

/// `POST /generate?stream=fmp4`: the headers known before the render, chunked transfer, a body
/// that is a fragmented MP4 with the clip's frames and audio, and its first byte and first whole
/// fragment received well before the last byte (a route that buffered the whole MP4 fails that).
#[test]
fn a_streamed_render_sends_its_fragments_while_it_renders() {
    let _r = render_lock();
    let s = start(&["--window", "1"]);
    let f = form(speech_clip(8.0), &[("stride", "2"), ("face_box", "center")])
        .part("video", part(png(128, 128), "a.png", "image/png"));
    let t0 = Instant::now();
    let mut r = client().post(s.url("/generate?stream=fmp4")).multipart(f).send().unwrap();
    assert_eq!(r.status(), 200);
    let ct = header(&r, "content-type").to_string();
    assert!(ct.starts_with("video/mp4; codecs=\"avc1.") && ct.ends_with(", mp4a.40.2\""), "{ct}");
    assert_eq!(header(&r, "transfer-encoding"), "chunked");
    assert!(r.headers().get("content-length").is_none());
    assert_eq!(header(&r, "x-stride"), "2");
    let frames: usize = header(&r, "x-frames").parse().unwrap();
    assert!((199..=201).contains(&frames), "{frames} frames for 8 s at 25 fps");
    assert!(header(&r, "x-weights").starts_with("synthetic"));
    assert!(!header(&r, "x-request-id").is_empty());
    assert!(header(&r, "server-timing").contains("first_byte;dur="), "{}", header(&r, "server-timing"));
    // Known only at the end: not in the headers.
    assert!(r.headers().get("x-inference-fps").is_none());
    let (body, arrivals) = read_timed(&mut r, t0).unwrap();

    // Where the first fragment (moof + mdat) ends, and when the client had it.
    let boxes = top_level_boxes(&body);
    let kinds: Vec<&str> = boxes.iter().map(|b| b.0.as_str()).collect();
    assert_eq!(&kinds[..4], ["ftyp", "moov", "moof", "mdat"], "{kinds:?}");
    let first_fragment_end = boxes[3].2;
    let t_first = arrivals[0].0;
    let t_fragment = arrivals.iter().find(|a| a.1 >= first_fragment_end).unwrap().0;
    let t_end = arrivals.last().unwrap().0;
    eprintln!(
        "streamed 8 s: first byte at {t_first:.2} s, first fragment at {t_fragment:.2} s, last byte at {t_end:.2} s \
         ({} reads, {} bytes)",
        arrivals.len(),
        body.len()
    );
    // The first window (1 s) comes before the first byte, the first GOP (2 s) and the window
    // holding its end before the first fragment; the render goes on for 8 s of video.
    assert!(t_first <= 0.5 * t_end, "the first byte arrived at {t_first:.2} s of {t_end:.2} s: not streamed");
    assert!(
        t_fragment <= 0.75 * t_end,
        "the first fragment arrived at {t_fragment:.2} s of {t_end:.2} s: not streamed"
    );

    let (_dir, mut mp4) = read_back(&body);
    assert!(mp4.is_fragmented());
    // One fragment per 2 s GOP.
    assert_eq!((mp4.fragments(), mp4.video_samples().unwrap().samples.len()), (frames.div_ceil(50), frames));
    assert!(mp4.audio_samples().unwrap().is_some(), "no audio track");
    let video = mp4.decode_video().unwrap();
    assert_eq!((video.width, video.height, video.frames.len()), (128, 128, frames));
    let audio = mp4.decode_audio().unwrap().unwrap();
    let seconds = audio.frames() as f64 / audio.sample_rate as f64;
    assert!((seconds - 8.0).abs() < 0.2, "{seconds} s of audio");

    wait_for(Duration::from_secs(5), || metric(&s, "cadence_streamed_renders_total{outcome=\"ok\"}") == 1.0);
    assert_eq!(metric(&s, "cadence_renders_total{outcome=\"ok\"}"), 1.0);
    assert_eq!(metric(&s, "cadence_time_to_first_byte_seconds_count"), 1.0);
    let ttfb = metric(&s, "cadence_time_to_first_byte_seconds_sum");
    assert!(ttfb > 0.0 && ttfb <= t_first, "time to first byte {ttfb} s, first byte read at {t_first} s");
    wait_for(Duration::from_secs(2), || metric(&s, "cadence_renders_running") == 0.0);
    wait_for(Duration::from_secs(5), || s.temp_entries().is_empty());
}

/// The JSON variant streams too (one fragment for a short clip).
#[test]
fn a_streamed_json_render_is_a_fragmented_mp4() {
    let _r = render_lock();
    let s = start(&[]);
    let b64 = |b: Vec<u8>| base64::engine::general_purpose::STANDARD.encode(b);
    let body = serde_json::json!({"audio_b64": b64(tone_wav(0.4)), "avatar_b64": b64(png(128, 96)), "stride": 2, "face_box": "center"});
    let mut r = client()
        .post(s.url("/generate?stream=fmp4"))
        .header("content-type", "application/json")
        .body(body.to_string())
        .send()
        .unwrap();
    assert_eq!(r.status(), 200);
    assert!(header(&r, "content-type").starts_with("video/mp4; codecs=\"avc1."));
    assert_eq!((header(&r, "x-stride"), header(&r, "x-frames")), ("2", "10"));
    let (body, _) = read_timed(&mut r, Instant::now()).unwrap();
    let (_dir, mut mp4) = read_back(&body);
    assert!(mp4.is_fragmented());
    assert_eq!((mp4.fragments(), mp4.video_samples().unwrap().samples.len()), (1, 10));
    assert_eq!(mp4.decode_video().unwrap().frames.len(), 10);
    assert!(mp4.decode_audio().unwrap().is_some());
}

/// A client that closes the connection mid-stream cancels the render: the slot is free for the
/// next request at once and the request's directory is gone.
#[test]
fn a_client_that_leaves_a_stream_cancels_its_render_and_frees_the_slot() {
    let _r = render_lock();
    let s = start(&["--slots", "1", "--queue", "0", "--window", "1"]);
    let f = form(long_clip(), &[("stride", "2"), ("face_box", "center")])
        .part("video", part(png(128, 128), "a.png", "image/png"));
    let mut r = client().post(s.url("/generate?stream=fmp4")).multipart(f).send().unwrap();
    assert_eq!(r.status(), 200);
    let mut first = [0u8; 4096];
    assert!(std::io::Read::read(&mut r, &mut first).unwrap() > 0);
    assert_eq!(metric(&s, "cadence_renders_running"), 1.0);
    assert!(!s.temp_entries().is_empty(), "the render's directory exists while it runs");
    let t = Instant::now();
    drop(r);
    wait_for(Duration::from_secs(20), || metric(&s, "cadence_streamed_renders_total{outcome=\"cancelled\"}") == 1.0);
    eprintln!("the render stopped {:.2} s after the client left", t.elapsed().as_secs_f64());
    assert_eq!(metric(&s, "cadence_renders_total{outcome=\"cancelled\"}"), 1.0);
    wait_for(Duration::from_secs(2), || metric(&s, "cadence_renders_running") == 0.0);
    wait_for(Duration::from_secs(5), || s.temp_entries().is_empty());
    assert_eq!(metric(&s, "cadence_time_to_first_byte_seconds_count"), 1.0);
    // The slot is free (with no queue, a busy slot would be 429).
    let f = form(tone_wav(0.2), &[("face_box", "center")]).part("video", part(png(128, 128), "a.png", "image/png"));
    assert_eq!(client().post(s.url("/generate?stream=fmp4")).multipart(f).send().unwrap().status(), 200);
}

/// A render that fails after the headers went out (here: cancelled by the drain deadline) cuts
/// the body off: the client's read fails instead of ending on a well-formed, shorter MP4.
#[test]
fn a_stream_whose_render_fails_ends_in_a_broken_transfer() {
    let _r = render_lock();
    let mut s = start(&["--drain-seconds", "0.5", "--window", "1"]);
    let f = form(long_clip(), &[("stride", "2"), ("face_box", "center")])
        .part("video", part(png(128, 128), "a.png", "image/png"));
    let mut r = client().post(s.url("/generate?stream=fmp4")).multipart(f).send().unwrap();
    assert_eq!(r.status(), 200);
    let mut first = [0u8; 4096];
    assert!(std::io::Read::read(&mut r, &mut first).unwrap() > 0);
    s.server.shutdown();
    let (e, rest) = match read_timed(&mut r, Instant::now()) {
        Ok((body, _)) => panic!("the body ended as if it were complete, after {} more bytes", body.len()),
        Err(cut) => cut,
    };
    eprintln!("the cut-off body: {e} after {} more bytes", rest.len());
    let TestServer { server, temp } = s;
    server.stop().unwrap();
    assert_eq!(std::fs::read_dir(temp.path()).unwrap().count(), 0);
}

#[test]
fn an_unknown_stream_value_is_refused_before_any_work() {
    let s = start(&[]);
    let c = client();
    let multipart = |q: &str| c.post(s.url(&format!("/generate{q}"))).multipart(form(tone_wav(0.2), &[])).send();
    let r = multipart("?stream=bogus").unwrap();
    assert_eq!(r.status(), 422);
    assert!(r.headers().contains_key("x-request-id"));
    assert_eq!(error_code(r), "invalid_stream");
    assert_eq!(error_code(multipart("?stream=fmp4&x=1").unwrap()), "unknown_parameter");
    let b64 = base64::engine::general_purpose::STANDARD.encode(tone_wav(0.2));
    let r = c
        .post(s.url("/generate?stream=mp4"))
        .header("content-type", "application/json")
        .body(serde_json::json!({ "audio_b64": b64 }).to_string())
        .send()
        .unwrap();
    assert_eq!((r.status().as_u16(), error_code(r).as_str()), (422, "invalid_stream"));
    assert_eq!(metric(&s, "cadence_rejections_total{reason=\"invalid\"}"), 3.0);
    assert_eq!(metric(&s, "cadence_avatar_preparations_total"), 0.0);
    assert!(s.temp_entries().is_empty());
}

/// Slow clients are cut off, and the server answers others meanwhile: a request head sent a
/// line at a time closes its connection past --header-timeout-seconds; a body trickling below
/// --body-min-rate is answered 408 past its time. Without the timeouts both held their
/// connections for as long as they kept sending (a byte a second was enough).
#[test]
fn slow_clients_are_cut_off() {
    use std::io::{Read, Write};
    let s = start(&[
        "--header-timeout-seconds",
        "1",
        "--body-timeout-seconds",
        "1",
        "--body-min-rate",
        "1000",
        "--body-max-seconds",
        "3",
    ]);
    let connect = || {
        let c = std::net::TcpStream::connect(s.server.addr).unwrap();
        c.set_read_timeout(Some(Duration::from_millis(50))).unwrap();
        c
    };
    // Reads what has come; `None` once the server closed the connection.
    let poll = |c: &mut std::net::TcpStream, got: &mut Vec<u8>| -> Option<()> {
        let mut buf = [0u8; 4096];
        match c.read(&mut buf) {
            Ok(0) => None,
            Ok(n) => {
                got.extend_from_slice(&buf[..n]);
                Some(())
            }
            Err(e) if matches!(e.kind(), std::io::ErrorKind::WouldBlock | std::io::ErrorKind::TimedOut) => Some(()),
            Err(_) => None,
        }
    };

    // The head, a header line every 200 ms.
    let mut c = connect();
    let t = Instant::now();
    c.write_all(b"GET /v1/info HTTP/1.1\r\nHost: cadence\r\n").unwrap();
    let mut got = Vec::new();
    while t.elapsed() < Duration::from_secs(8) {
        if c.write_all(b"X-Slow: 1\r\n").is_err() || poll(&mut c, &mut got).is_none() {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    let held = t.elapsed();
    assert!(held > Duration::from_millis(900) && held < Duration::from_secs(4), "the slow head held {held:?}");
    assert!(got.is_empty(), "{}", String::from_utf8_lossy(&got));
    wait_for(Duration::from_secs(5), || metric(&s, "cadence_rejections_total{reason=\"header_timeout\"}") == 1.0);

    // The body, a byte every 200 ms: 1 s, and 1 ms more per byte.
    let mut c = connect();
    let t = Instant::now();
    c.write_all(
        b"POST /generate HTTP/1.1\r\nHost: cadence\r\nContent-Type: application/json\r\nContent-Length: 1000\r\n\r\n",
    )
    .unwrap();
    let mut got = Vec::new();
    let mut others_answered = false;
    while t.elapsed() < Duration::from_secs(8) && !got.ends_with(b"}}") {
        if c.write_all(b" ").is_err() || poll(&mut c, &mut got).is_none() {
            break;
        }
        others_answered |= get(&s, "/healthz").status() == 200;
        std::thread::sleep(Duration::from_millis(200));
    }
    let held = t.elapsed();
    let answer = String::from_utf8_lossy(&got);
    assert!(answer.starts_with("HTTP/1.1 408"), "{answer}");
    assert!(answer.contains("\"request_timeout\"") && answer.contains("--body-min-rate"), "{answer}");
    assert!(answer.to_ascii_lowercase().contains("connection: close"), "{answer}");
    assert!(held > Duration::from_millis(900) && held < Duration::from_secs(4), "the slow body held {held:?}");
    assert!(others_answered, "the server answered no one else meanwhile");
    assert_eq!(metric(&s, "cadence_rejections_total{reason=\"body_timeout\"}"), 1.0);

    // A body that keeps up with --body-min-rate is read whole: 2000 bytes in 1.6 s at 1250 B/s,
    // past the first second; refused only for what it holds (not JSON), never as too slow.
    let mut c = connect();
    c.write_all(
        b"POST /generate HTTP/1.1\r\nHost: cadence\r\nContent-Type: application/json\r\nContent-Length: 2000\r\n\r\n",
    )
    .unwrap();
    for _ in 0..8 {
        c.write_all(&[b' '; 250]).unwrap();
        std::thread::sleep(Duration::from_millis(200));
    }
    let mut got = Vec::new();
    let t = Instant::now();
    while t.elapsed() < Duration::from_secs(5) && !got.ends_with(b"}}") && poll(&mut c, &mut got).is_some() {}
    let answer = String::from_utf8_lossy(&got);
    assert!(answer.starts_with("HTTP/1.1 4") && !answer.starts_with("HTTP/1.1 408"), "{answer}");
}
