//! CSV with provenance, provenance gathering, plots and output directories.

use experiments::plot::{bar_plot, line_plot, line_plot_grid, BarChart, LineChart, LineStyle, Series};
use experiments::provenance::{civil_from_days, utc_timestamp};
use experiments::{read_provenance, read_rows, write_csv, OutDir, Provenance};
use std::time::{Duration, UNIX_EPOCH};

#[derive(serde::Serialize, serde::Deserialize, Debug, PartialEq, Clone)]
struct Row {
    theta_rad: f64,
    alpha: f64,
    name: String,
    stride: Option<usize>,
}

fn rows() -> Vec<Row> {
    vec![
        Row { theta_rad: 0.0, alpha: 0.5, name: "dense".into(), stride: Some(1) },
        Row { theta_rad: 1.25, alpha: 0.1, name: "with, comma".into(), stride: None },
    ]
}

fn prov() -> Provenance {
    let mut p = Provenance::gather("cpu (test)", "n/a", "synthetic");
    p.note("extra_key", "line one\nline two");
    p
}

#[test]
fn csv_starts_with_provenance_then_header_and_rows() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.csv");
    let p = prov();
    write_csv(&path, &p, &rows()).unwrap();
    let text = std::fs::read_to_string(&path).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    let keys = [
        "commit",
        "dirty",
        "date_utc",
        "hardware",
        "backend",
        "engine_profile",
        "weights",
        "command_line",
        "extra_key",
    ];
    for (l, k) in lines.iter().zip(keys) {
        assert!(l.starts_with(&format!("# {k}: ")), "line {l:?} should carry {k}");
    }
    assert_eq!(lines[4], "# backend: cpu (test)");
    assert_eq!(lines[5], "# engine_profile: n/a");
    assert_eq!(lines[6], "# weights: synthetic");
    assert_eq!(lines[8], "# extra_key: line one line two", "values are kept on one line");
    assert_eq!(lines[9], "theta_rad,alpha,name,stride");
    assert_eq!(lines[10], "0.0,0.5,dense,1");
    assert_eq!(lines[11], "1.25,0.1,\"with, comma\",");
    assert_eq!(lines.len(), 12);
    // Round trip through the readers.
    assert_eq!(read_rows::<Row>(&path).unwrap(), rows());
    let pv = read_provenance(&path).unwrap();
    assert_eq!(pv, p.pairs());
    assert_eq!(pv.len(), keys.len());
}

#[test]
fn csv_writes_atomically() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("t.csv");
    write_csv(&path, &prov(), &rows()).unwrap();
    // Replacing keeps no stale content.
    write_csv(&path, &prov(), &rows()[..1]).unwrap();
    assert_eq!(read_rows::<Row>(&path).unwrap().len(), 1);
    // An empty table is refused and leaves the old file alone.
    let err = write_csv::<Row>(&path, &prov(), &[]).unwrap_err();
    assert!(format!("{err:#}").contains("no rows"), "{err:#}");
    assert_eq!(read_rows::<Row>(&path).unwrap().len(), 1);
    // A missing directory is an error, and nothing is left behind.
    let bad = dir.path().join("missing").join("t.csv");
    assert!(write_csv(&bad, &prov(), &rows()).is_err());
    let names: Vec<_> = std::fs::read_dir(dir.path()).unwrap().map(|e| e.unwrap().file_name()).collect();
    assert_eq!(names, vec![std::ffi::OsString::from("t.csv")], "no temporary file may remain");
}

#[test]
fn provenance_gathers_what_the_run_can_know() {
    let p = Provenance::gather("cpu", "n/a", "n/a");
    assert!(
        p.commit == "unknown" || (p.commit.len() >= 4 && p.commit.chars().all(|c| c.is_ascii_hexdigit())),
        "commit {:?}",
        p.commit
    );
    if p.commit == "unknown" {
        assert_eq!(p.dirty, None);
    } else {
        assert!(p.dirty.is_some());
    }
    let d = p.date_utc.as_bytes();
    assert_eq!(d.len(), 20, "{}", p.date_utc);
    assert!(d[4] == b'-' && d[7] == b'-' && d[10] == b'T' && d[13] == b':' && d[19] == b'Z', "{}", p.date_utc);
    assert!(p.hardware.contains("logical CPUs"), "{}", p.hardware);
    assert!(!p.command_line.is_empty());
    assert_eq!(p.clone().with_gpu("Test GPU").hardware, format!("{}; GPU: Test GPU", p.hardware));
    let backends = vec![cadence::Backend::Cpu];
    let pb = Provenance::for_backends(&backends, "reduced", "synthetic");
    assert!(pb.backend.starts_with("cpu ("), "{}", pb.backend);
    let footer = pb.footer_lines();
    assert!(footer[0].contains(&pb.commit) && footer[0].contains("reduced") && footer[0].contains("synthetic"));
    assert!(footer[1].contains(&pb.backend) && footer[1].contains(&pb.hardware));
    assert!(!footer[1].contains("engines on"), "no engines, no engine device: {}", footer[1]);
    let mut pe = pb.clone();
    pe.note(experiments::provenance::ENGINE_DEVICE_KEY, "cuda:0 (Test GPU)");
    assert_eq!(pe.note_value(experiments::provenance::ENGINE_DEVICE_KEY), Some("cuda:0 (Test GPU)"));
    assert!(pe.footer_lines()[1].contains("engines on: cuda:0 (Test GPU)"), "{}", pe.footer_lines()[1]);
}

#[test]
fn utc_dates_by_hand() {
    assert_eq!(civil_from_days(0), (1970, 1, 1));
    assert_eq!(civil_from_days(11016), (2000, 2, 29));
    assert_eq!(civil_from_days(19723), (2024, 1, 1));
    assert_eq!(civil_from_days(-1), (1969, 12, 31));
    let t = UNIX_EPOCH + Duration::from_secs(19723 * 86400 + 3600 + 60 + 1);
    assert_eq!(utc_timestamp(t), "2024-01-01T01:01:01Z");
}

#[test]
fn out_dir_is_created() {
    let dir = tempfile::tempdir().unwrap();
    let want = dir.path().join("a").join("b");
    let o = OutDir { out: Some(want.clone()) };
    assert_eq!(o.dir().unwrap(), want);
    assert!(want.is_dir());
    let file = dir.path().join("f");
    std::fs::write(&file, "x").unwrap();
    assert!(OutDir { out: Some(file) }.dir().is_err(), "a file is not an output directory");
    assert!(experiments::results_dir().unwrap().ends_with("results"));
}

fn check_plot_files(files: &experiments::plot::PlotFiles, p: &Provenance, title: &str) {
    let png = std::fs::read(&files.png).unwrap();
    assert_eq!(&png[..8], b"\x89PNG\r\n\x1a\n");
    let svg = std::fs::read_to_string(&files.svg).unwrap();
    assert!(svg.contains("<svg"));
    assert!(svg.contains(title), "the title is in the SVG");
    assert!(svg.contains(&format!("commit {}", p.commit)), "the provenance footer is in the SVG");
    let dir = files.png.parent().unwrap();
    let leftovers: Vec<_> = std::fs::read_dir(dir)
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().to_string())
        .filter(|n| n.contains("partial"))
        .collect();
    assert!(leftovers.is_empty(), "{leftovers:?}");
}

#[test]
fn line_and_bar_plots_write_png_and_svg_with_footer() {
    experiments::plot::ensure_font().expect("the bundled font parses");
    let dir = tempfile::tempdir().unwrap();
    let p = Provenance::gather("cpu", "n/a", "n/a");
    let chart = LineChart::new("Norm ratio", "theta", "ratio")
        .series(Series::new("lerp", (0..20).map(|i| (i as f64 * 0.1, (i as f64 * 0.05).cos())).collect()))
        .series(Series::new("analytic", vec![(0.0, 1.0), (1.9, 0.6)]).style(LineStyle::Dashed))
        .series(Series::new("slerp", vec![(0.0, 1.0), (1.9, 1.0)]).style(LineStyle::SolidMarkers));
    let files = line_plot(&dir.path().join("line"), &chart, &p).unwrap();
    check_plot_files(&files, &p, "Norm ratio");
    let log = LineChart::new("Log axes", "MB", "GB/s")
        .log_x()
        .log_y()
        .series(Series::new("a", vec![(0.1, 1.0), (10.0, 30.0), (-1.0, 5.0)]));
    let files = line_plot_grid(&dir.path().join("grid"), "Grid title", &[chart.clone(), log], 2, &p).unwrap();
    check_plot_files(&files, &p, "Grid title");
    let bars = BarChart {
        title: "Frames per second".into(),
        x_label: "stride".into(),
        y_label: "frames/s".into(),
        categories: vec!["k=1".into(), "k=2".into(), "k=3".into()],
        series: vec![("neural".into(), vec![10.0, 19.5, 28.0]), ("end to end".into(), vec![8.0, 15.0, 20.0])],
        value_labels: true,
    };
    let files = bar_plot(&dir.path().join("bars"), &bars, &p).unwrap();
    check_plot_files(&files, &p, "Frames per second");
    assert!(std::fs::read_to_string(&files.svg).unwrap().contains("k=2"), "category labels are drawn");
}

#[test]
fn plots_refuse_empty_or_unplottable_data() {
    let dir = tempfile::tempdir().unwrap();
    let p = Provenance::gather("cpu", "n/a", "n/a");
    assert!(line_plot(&dir.path().join("e"), &LineChart::new("empty", "x", "y"), &p).is_err());
    let neg = LineChart::new("neg", "x", "y").log_y().series(Series::new("s", vec![(1.0, -1.0), (2.0, 0.0)]));
    assert!(line_plot(&dir.path().join("n"), &neg, &p).is_err(), "log axis with no positive value");
    let bad = BarChart {
        title: "b".into(),
        categories: vec!["a".into()],
        series: vec![("s".into(), vec![1.0, 2.0])],
        ..Default::default()
    };
    assert!(bar_plot(&dir.path().join("b"), &bad, &p).is_err());
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 0, "failed plots leave no files");
}
