//! The page at `GET /` in a real headless browser (Debian's `chromium`), driven through the
//! DevTools protocol: the page loads, a WAV and a portrait are picked, a render streams and plays
//! to its end through Media Source Extensions, and the numbers appear. Skipped (and counted) when
//! no chromium is on PATH; `.ci/run` installs it.

mod common;

use common::*;
use serde_json::{json, Value};
use std::io::{BufRead, BufReader};
use std::net::TcpStream;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};
use tungstenite::{Message, WebSocket};

/// The whole browser session's bound: start, render, playback.
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
                "{what}: not within {LIMIT:?}; page state {}",
                self.eval("JSON.stringify(window.cadence)")
            );
            std::thread::sleep(Duration::from_millis(100));
        }
    }
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

    let (_browser, url) = launch(bin);
    let mut dt = DevTools::connect(&url);
    let target = dt.call("Target.createTarget", json!({"url": s.url("/")}));
    let session = dt.call("Target.attachToTarget", json!({"targetId": target["targetId"], "flatten": true}));
    dt.session = Some(session["sessionId"].as_str().unwrap().to_string());
    dt.wait("the page loads", t0, |d| {
        d.eval("document.readyState") == "complete" && d.eval("typeof window.cadence") == "object"
    });
    assert_eq!(dt.eval("document.title"), "cadence");

    let root = dt.call("DOM.getDocument", json!({}))["root"]["nodeId"].clone();
    for (selector, path) in [("#audio", &wav), ("#video", &portrait)] {
        let node = dt.call("DOM.querySelector", json!({"nodeId": root, "selector": selector}))["nodeId"].clone();
        dt.call("DOM.setFileInputFiles", json!({"nodeId": node, "files": [path.to_str().unwrap()]}));
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
