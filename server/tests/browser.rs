//! The page at `GET /` in a real headless browser (Debian's `chromium`), driven through the
//! DevTools protocol. File mode: a WAV and a portrait are picked, a render streams and plays to
//! its end through Media Source Extensions, and the numbers appear. Live mode: the browser's own
//! WebRTC stack connects to a session (its offer, as a browser makes it, against the server's
//! answer), decodes H.264 and Opus, sends a WAV, interrupts and hangs up. Skipped (and counted)
//! when no chromium is on PATH; `.ci/run` installs it.

mod common;

use common::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tungstenite::{Message, WebSocket};

/// Each browser session's bound: start, render or connect, playback.
const LIMIT: Duration = Duration::from_secs(120);

fn chromium() -> Option<&'static str> {
    ["chromium", "chromium-browser"]
        .into_iter()
        .find(|b| Command::new(b).arg("--version").output().is_ok_and(|o| o.status.success()))
}

/// A headless browser, killed when dropped.
struct Browser {
    _child: KillOnDrop,
    _profile: tempfile::TempDir,
}

/// Starts `bin` headless on a free DevTools port; returns it and the browser's websocket URL.
fn launch(bin: &str) -> (Browser, String) {
    let profile = tempfile::tempdir().unwrap();
    let mut child = Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-quic",
            "--no-first-run",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--autoplay-policy=no-user-gesture-required",
            // The live mode's peer connection: host candidates with their addresses rather than
            // mDNS names (the server is ICE-lite and learns the address from the checks anyway,
            // but a log then shows where they came from).
            "--disable-features=WebRtcHideLocalIpsWithMdns",
            "--remote-debugging-address=127.0.0.1",
            "--remote-debugging-port=0",
        ])
        .arg(format!("--user-data-dir={}", profile.path().display()))
        .arg("about:blank")
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let browser = Browser { _child: KillOnDrop(child), _profile: profile };
    let (tx, rx) = std::sync::mpsc::channel();
    // Chromium says where DevTools listen on stderr; the rest of its stderr is drained.
    std::thread::spawn(move || {
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(url) = line.split("DevTools listening on ").nth(1) {
                let _ = tx.send(url.trim().to_string());
            }
        }
    });
    let url = rx.recv_timeout(Duration::from_secs(30)).expect("chromium did not open DevTools within 30 s");
    (browser, url)
}

/// A DevTools connection in flat session mode: commands to the browser or to one page session.
struct DevTools {
    ws: WebSocket<TcpStream>,
    next: u64,
    session: Option<String>,
}

impl DevTools {
    fn connect(url: &str) -> Self {
        let addr = url.strip_prefix("ws://").unwrap().split('/').next().unwrap();
        let stream = TcpStream::connect(addr).unwrap();
        stream.set_read_timeout(Some(Duration::from_secs(30))).unwrap();
        let (ws, _) = tungstenite::client(url, stream).unwrap();
        Self { ws, next: 0, session: None }
    }

    fn call(&mut self, method: &str, params: Value) -> Value {
        self.next += 1;
        let mut msg = json!({"id": self.next, "method": method, "params": params});
        if let Some(s) = &self.session {
            msg["sessionId"] = json!(s);
        }
        self.ws.send(Message::text(msg.to_string())).unwrap();
        loop {
            let Message::Text(text) = self.ws.read().unwrap() else { continue };
            let v: Value = serde_json::from_str(&text).unwrap();
            if v["id"] == self.next {
                assert!(v["error"].is_null(), "{method}: {v}");
                return v["result"].clone();
            }
        }
    }

    /// A JavaScript expression's value in the page.
    fn eval(&mut self, expr: &str) -> Value {
        let r = self.call("Runtime.evaluate", json!({"expression": expr, "returnByValue": true, "awaitPromise": true}));
        assert!(r["exceptionDetails"].is_null(), "{expr}: {r}");
        r["result"]["value"].clone()
    }

    fn wait(&mut self, what: &str, t0: Instant, mut ok: impl FnMut(&mut Self) -> bool) {
        while !ok(self) {
            assert!(
                t0.elapsed() < LIMIT,
                "{what}: not within {LIMIT:?}; page state {}, live {}",
                self.eval("JSON.stringify(window.cadence)"),
                self.eval("JSON.stringify(window.cadenceLive)")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
}

/// A headless browser with the server's page open in a page session.
fn open_page(bin: &str, s: &TestServer, t0: Instant) -> (Browser, DevTools) {
    let (browser, url) = launch(bin);
    let mut dt = DevTools::connect(&url);
    let target = dt.call("Target.createTarget", json!({"url": s.url("/")}));
    let session = dt.call("Target.attachToTarget", json!({"targetId": target["targetId"], "flatten": true}));
    dt.session = Some(session["sessionId"].as_str().unwrap().to_string());
    dt.wait("the page loads", t0, |d| {
        d.eval("document.readyState") == "complete" && d.eval("typeof window.cadence") == "object"
    });
    (browser, dt)
}

/// Picks `path` in the page's file input `selector`.
fn pick_file(dt: &mut DevTools, selector: &str, path: &std::path::Path) {
    let root = dt.call("DOM.getDocument", json!({}))["root"]["nodeId"].clone();
    let node = dt.call("DOM.querySelector", json!({"nodeId": root, "selector": selector}))["nodeId"].clone();
    dt.call("DOM.setFileInputFiles", json!({"nodeId": node, "files": [path.to_str().unwrap()]}));
}

#[test]
fn the_page_renders_and_plays_a_stream_and_shows_its_numbers() {
    let Some(bin) = chromium() else {
        // Counted and listed by scripts/test.sh; .ci/run installs chromium.
        skipped("the_page_renders_and_plays_a_stream_and_shows_its_numbers", "no chromium on PATH");
        return;
    };
    let _r = render_lock();
    let t0 = Instant::now();
    let s = start(&[]);
    let files = tempfile::tempdir().unwrap();
    let (wav, portrait) = (files.path().join("speech.wav"), files.path().join("portrait.png"));
    std::fs::write(&wav, speech_clip(2.0)).unwrap();
    // The page sends no face box: a real face, which the server finds.
    std::fs::write(&portrait, face_png()).unwrap();

    let (_browser, mut dt) = open_page(bin, &s, t0);
    assert_eq!(dt.eval("document.title"), "cadence");

    for (selector, path) in [("#audio", &wav), ("#video", &portrait)] {
        pick_file(&mut dt, selector, path);
    }
    let mime = dt.eval("MediaSource.isTypeSupported('video/mp4; codecs=\"avc1.42C01E, mp4a.40.2\"')");
    eprintln!("this chromium plays H.264 + AAC through MSE: {mime}");
    dt.eval("document.getElementById('stride').value = '2'; document.getElementById('render').click(); true");
    dt.wait("the render ends", t0, |d| ["done", "failed"].contains(&d.eval("window.cadence.phase").as_str().unwrap()));
    let state = dt.eval("window.cadence");
    if mime != json!(true) {
        // This browser cannot decode H.264: the page says so instead of failing silently.
        assert_eq!(state["phase"], "failed", "{state}");
        assert!(state["error"].as_str().unwrap().contains("cannot play"), "{state}");
        panic!("chromium here cannot play H.264 through Media Source Extensions: {state}");
    }
    assert_eq!(state["phase"], "done", "{state}");
    assert!(state["firstByteMs"].as_f64().unwrap() > 0.0 && state["bytes"].as_u64().unwrap() > 1000, "{state}");
    // Played to its end, with every frame of the 2 s clip.
    dt.wait("the video plays to its end", t0, |d| d.eval("window.cadence.ended") == true);
    let duration = dt.eval("document.getElementById('player').duration").as_f64().unwrap();
    assert!((duration - 2.0).abs() < 0.1, "{duration} s");
    let decoded = dt.eval("document.getElementById('player').getVideoPlaybackQuality().totalVideoFrames");
    assert!(decoded.as_u64().unwrap() >= 45, "{decoded} frames decoded");
    // The numbers, from the job record of the streamed render.
    let numbers = dt.eval(
        "Object.fromEntries([...document.querySelectorAll('#numbers tr')].map(r => [r.dataset.key, r.cells[1].textContent]))",
    );
    assert_eq!((numbers["frames"].as_str(), numbers["stride"].as_str()), (Some("50"), Some("2")), "{numbers}");
    assert!(numbers["inference fps"].as_str().unwrap().parse::<f64>().unwrap() > 0.0, "{numbers}");
    assert!(numbers["server timing"].as_str().unwrap().contains("unet;dur="), "{numbers}");
    assert_eq!(state["stats"]["frames"], 50);
    eprintln!("browser session: {:.1} s; page numbers {numbers}", t0.elapsed().as_secs_f64());
}

fn session_figures(s: &TestServer, id: &str) -> Value {
    let r = get(s, &format!("/v1/sessions/{id}"));
    assert_eq!(r.status(), 200, "session {id}");
    r.json().unwrap()
}

/// The live mode with chromium's own WebRTC: the browser's offer (all its codecs, BUNDLE,
/// rtcp-mux, DTLS as it negotiates it) against the server's answer, then what it decodes.
#[test]
fn the_live_mode_receives_h264_and_opus_speaks_a_wav_interrupts_and_hangs_up() {
    let Some(bin) = chromium() else {
        skipped("the_live_mode_receives_h264_and_opus_speaks_a_wav_interrupts_and_hangs_up", "no chromium on PATH");
        return;
    };
    let _r = render_lock();
    let t0 = Instant::now();
    let s = start(&["--max-sessions", "1"]);
    let files = tempfile::tempdir().unwrap();
    let wav = files.path().join("speech.wav");
    // Long enough to be still speaking when interrupted.
    std::fs::write(&wav, speech_clip(10.0)).unwrap();
    let (_browser, mut dt) = open_page(bin, &s, t0);
    dt.eval("document.querySelector('input[name=mode][value=live]').click(); true");
    assert_eq!(dt.eval("document.getElementById('live_mode').hidden"), false);
    assert_eq!(dt.eval("document.getElementById('file_mode').hidden"), true);
    let phase = |d: &mut DevTools| d.eval("window.cadenceLive.phase").as_str().unwrap().to_string();
    let status = |d: &mut DevTools| {
        (
            d.eval("document.getElementById('live_status').textContent"),
            d.eval("document.getElementById('live_status').className"),
        )
    };

    // The server's errors reach the user: an avatar it does not know.
    dt.eval("document.getElementById('live_avatar_id').value = '0'.repeat(64); document.getElementById('live_connect').click(); true");
    dt.wait("the refused connect", t0, |d| phase(d) != "connecting");
    let (text, class) = status(&mut dt);
    assert_eq!(phase(&mut dt), "failed");
    assert!(text.as_str().unwrap().starts_with("404 avatar_not_found: "), "{text}");
    assert_eq!(class, "error");
    assert_eq!(metric(&s, "cadence_sessions"), 0.0);

    // Connect with the default avatar.
    dt.eval(
        "document.getElementById('live_avatar_id').value = ''; document.getElementById('live_connect').click(); true",
    );
    dt.wait("the session starts", t0, |d| phase(d) != "connecting");
    assert_eq!(phase(&mut dt), "connected", "{:?}", status(&mut dt));
    let id = dt.eval("window.cadenceLive.sessionId").as_str().unwrap().to_string();
    let connected = Instant::now();
    // The browser decodes H.264 and receives Opus (silence while idle). framesDecoded counts
    // only pictures the decoder made: 50 is two seconds of the avatar at 25 fps.
    let stat = |d: &mut DevTools, k: &str| d.eval(&format!("window.cadenceLive.stats && window.cadenceLive.stats.{k}"));
    dt.wait("50 frames decoded", t0, |d| stat(d, "framesDecoded").as_u64().unwrap_or(0) >= 50);
    eprintln!("50 frames decoded {:.1} s after the answer", connected.elapsed().as_secs_f64());
    let stats = dt.eval("window.cadenceLive.stats");
    assert_eq!(stats["videoCodec"], "video/H264", "{stats}");
    assert_eq!(stats["audioCodec"], "audio/opus", "{stats}");
    assert!(stats["audioPackets"].as_u64().unwrap() >= 50, "{stats}");
    let f = session_figures(&s, &id);
    assert_eq!(
        (f["width"].clone(), f["height"].clone()),
        (stats["width"].clone(), stats["height"].clone()),
        "{f} {stats}"
    );
    // The page shows the session's figures and the browser's.
    let numbers = dt.eval(
        "Object.fromEntries([...document.querySelectorAll('#live_numbers tr')].map(r => [r.dataset.key, r.cells[1].textContent]))",
    );
    for k in [
        "speaking",
        "queued audio (s)",
        "frames sent",
        "stride",
        "late frames",
        "repeated frames",
        "audio/video skew (ms)",
        "frames decoded (browser)",
        "video codec (browser)",
    ] {
        assert!(numbers[k].as_str().is_some_and(|v| !v.is_empty()), "{k}: {numbers}");
    }
    assert_eq!(numbers["video codec (browser)"], "video/H264");

    let idle_energy = stat(&mut dt, "audioEnergy").as_f64().unwrap();

    // Speech from a WAV file, through the page.
    pick_file(&mut dt, "#live_wav", &wav);
    dt.eval("document.getElementById('live_send').click(); true");
    dt.wait("the WAV is queued", t0, |d| {
        !d.eval("window.cadenceLive.sent").is_null() || d.eval("window.cadenceLive.error") != Value::Null
    });
    let sent = dt.eval("window.cadenceLive.sent");
    assert!((sent["duration_s"].as_f64().unwrap_or(0.0) - 10.0).abs() < 0.01, "{sent}; {:?}", status(&mut dt));
    let t = Instant::now();
    while session_figures(&s, &id)["speaking"] != true {
        assert!(t.elapsed() < Duration::from_secs(10), "the session never spoke: {}", session_figures(&s, &id));
        std::thread::sleep(Duration::from_millis(100));
    }
    // Chromium's Opus decoder hears it: the track's energy (the sum over its samples of the
    // squared level times their duration) was nil while idle and grows with speech.
    let energy = |d: &mut DevTools| stat(d, "audioEnergy").as_f64().unwrap();
    assert!(idle_energy < 1e-6, "energy {idle_energy} while idle");
    dt.wait("the speech heard in chromium", t0, |d| energy(d) > 0.03);
    let before = session_figures(&s, &id);
    assert!(before["queued_audio_s"].as_f64().unwrap() > 3.0, "{before}");

    // Interrupt: the queued speech is dropped at once, the stream goes on.
    dt.eval("document.getElementById('live_interrupt').click(); true");
    dt.wait("the interrupt's answer", t0, |d| status(d).0.as_str().unwrap().starts_with("Interrupted"));
    let after = session_figures(&s, &id);
    assert_eq!(after["queued_audio_s"], 0.0, "{after}");
    assert_eq!(after["speaking"], false, "{after}");
    // The wire counts the interrupt when it sends its next frame.
    wait_for(Duration::from_secs(1), || session_figures(&s, &id)["interrupts"] == 1);
    // ... and chromium hears (near) silence from then on, after its jitter buffer: in a second,
    // under 2% of the energy the speech brought before it (speech going on would add about as
    // much again).
    let now_energy = |d: &mut DevTools| d.eval("browserStats().then(b => b.audioEnergy)").as_f64().unwrap();
    std::thread::sleep(Duration::from_millis(500));
    let e0 = now_energy(&mut dt);
    std::thread::sleep(Duration::from_secs(1));
    let e1 = now_energy(&mut dt);
    assert!(e1 - e0 < 0.02 * e0, "energy {e0} -> {e1} in the second after the interrupt");
    let decoded = stat(&mut dt, "framesDecoded").as_u64().unwrap();
    dt.wait("frames after the interrupt", t0, |d| stat(d, "framesDecoded").as_u64().unwrap() >= decoded + 25);
    let f = session_figures(&s, &id);
    assert!(f["interrupt_latency_ms"].as_f64().is_some_and(|ms| ms <= 80.0), "{f}");
    assert_eq!(f["state"], "connected", "{f}");

    // Text: spoken where the server has libespeak-ng, else the page shows the server's 501.
    dt.eval(
        "document.getElementById('live_text').value = 'Hello.'; document.getElementById('live_speak').click(); true",
    );
    dt.wait("the speak's answer", t0, |d| {
        let t = status(d).0;
        t.as_str().unwrap().starts_with("Queued") || status(d).1 == "error"
    });
    let (text, class) = status(&mut dt);
    if cadence::schedules::espeak::available() {
        assert!(text.as_str().unwrap().starts_with("Queued") && class == "", "{text}");
        assert!(session_figures(&s, &id)["queued_audio_s"].as_f64().unwrap() > 0.0);
    } else {
        assert!(text.as_str().unwrap().starts_with("501 tts_unavailable: "), "{text}");
    }

    // Hang up: the session is gone.
    dt.eval("document.getElementById('live_hangup').click(); true");
    dt.wait("the hang-up", t0, |d| status(d).0.as_str().unwrap().ends_with("ended."));
    assert_eq!(phase(&mut dt), "closed");
    assert_eq!(get(&s, &format!("/v1/sessions/{id}")).status(), 404);
    wait_for(Duration::from_secs(5), || metric(&s, "cadence_sessions") == 0.0);

    // A portrait picked in the page is registered first (its id fills the avatar field), and
    // the session streams it: the pictures are the portrait's size, not the default avatar's.
    let portrait = files.path().join("portrait.png");
    std::fs::write(&portrait, face_png()).unwrap();
    pick_file(&mut dt, "#live_portrait", &portrait);
    dt.eval("document.getElementById('live_connect').click(); true");
    dt.wait("the portrait's session starts", t0, |d| phase(d) != "connecting");
    assert_eq!(phase(&mut dt), "connected", "{:?}", status(&mut dt));
    let avatar = dt.eval("document.getElementById('live_avatar_id').value");
    assert!(avatar.as_str().is_some_and(|a| a.len() == 64 && a.bytes().all(|b| b.is_ascii_hexdigit())), "{avatar}");
    let id = dt.eval("window.cadenceLive.sessionId").as_str().unwrap().to_string();
    let f = session_figures(&s, &id);
    assert_eq!((f["width"].as_u64(), f["height"].as_u64()), (Some(256), Some(256)), "{f}");
    dt.wait("the portrait's frames decoded", t0, |d| {
        stat(d, "framesDecoded").as_u64().unwrap_or(0) >= 25 && stat(d, "width").as_u64() == Some(256)
    });
    dt.eval("document.getElementById('live_hangup').click(); true");
    dt.wait("the second hang-up", t0, |d| phase(d) == "closed");
    wait_for(Duration::from_secs(5), || metric(&s, "cadence_sessions") == 0.0);
    eprintln!(
        "live browser session: {:.1} s; last browser stats {}",
        t0.elapsed().as_secs_f64(),
        dt.eval("window.cadenceLive.stats")
    );
}
