//! Adaptive keyframe schedules (`cadence::schedules`): alignment readers (TextGrid long and short
//! formats, JSON, malformed files), the phoneme class table, and the rules every schedule keeps
//! (exact budget, first and last frame, nothing in bypassed silence, speech-run ends).

use cadence::schedules::{
    self, active_runs, alignment::END_TOLERANCE_S, classes::classify, Alignment, Inputs, PhonemeClass, Planned,
    ScheduleKind, Target,
};
use proptest::prelude::*;
use PhonemeClass::*;

/// The same three-tier TextGrid (words, phones, a point tier) in Praat's long text format ...
const LONG: &str = r#"File type = "ooTextFile"
Object class = "TextGrid"

xmin = 0 
xmax = 0.6 
tiers? <exists> 
size = 3 
item []: 
    item [1]:
        class = "IntervalTier" 
        name = "words" 
        xmin = 0 
        xmax = 0.6 
        intervals: size = 2 
        intervals [1]:
            xmin = 0 
            xmax = 0.1 
            text = "" 
        intervals [2]:
            xmin = 0.1 
            xmax = 0.6 
            text = "bob ""the"" man" 
    item [2]:
        class = "IntervalTier" 
        name = "phones" 
        xmin = 0 
        xmax = 0.6 
        intervals: size = 5 
        intervals [1]:
            xmin = 0 
            xmax = 0.1 
            text = "" 
        intervals [2]:
            xmin = 0.1 
            xmax = 0.18 
            text = "B" 
        intervals [3]:
            xmin = 0.18 
            xmax = 0.4 
            text = "AA1" 
        intervals [4]:
            xmin = 0.4 
            xmax = 0.48 
            text = "B" 
        intervals [5]:
            xmin = 0.48 
            xmax = 0.6 
            text = "sil" 
    item [3]:
        class = "TextTier" 
        name = "bell" 
        xmin = 0 
        xmax = 0.6 
        points: size = 1 
        points [1]:
            number = 0.3 
            mark = "ding" 
"#;

/// ... and in the short format (with a Praat `!` comment).
const SHORT: &str = r#"File type = "ooTextFile"
Object class = "TextGrid"

0
0.6
<exists>
3
"IntervalTier"
"words"
0
0.6
2
0
0.1
""
0.1
0.6
"bob ""the"" man"
"IntervalTier"
"phones" ! the phone tier
0
0.6
5
0
0.1
""
0.1
0.18
"B"
0.18
0.4
"AA1"
0.4
0.48
"B"
0.48
0.6
"sil"
"TextTier"
"bell"
0
0.6
1
0.3
"ding"
"#;

fn phones(a: &Alignment) -> Vec<(f64, f64, &str)> {
    a.phones().iter().map(|p| (p.start, p.end, p.phoneme.as_str())).collect()
}

const EXPECTED: [(f64, f64, &str); 5] =
    [(0.0, 0.1, ""), (0.1, 0.18, "B"), (0.18, 0.4, "AA1"), (0.4, 0.48, "B"), (0.48, 0.6, "sil")];

#[test]
fn textgrid_long_and_short_formats_read_the_phone_tier() {
    for text in [LONG, SHORT] {
        let a = Alignment::from_textgrid(text).unwrap();
        assert_eq!(phones(&a), EXPECTED.to_vec());
    }
}

#[test]
fn textgrid_in_utf16_and_with_a_bom() {
    let dir = tempfile::tempdir().unwrap();
    for (name, bytes) in [
        ("le.TextGrid", [vec![0xff, 0xfe], SHORT.encode_utf16().flat_map(|u| u.to_le_bytes()).collect()].concat()),
        ("be.TextGrid", [vec![0xfe, 0xff], SHORT.encode_utf16().flat_map(|u| u.to_be_bytes()).collect()].concat()),
        ("bom.TextGrid", [vec![0xef, 0xbb, 0xbf], LONG.as_bytes().to_vec()].concat()),
    ] {
        let p = dir.path().join(name);
        std::fs::write(&p, bytes).unwrap();
        assert_eq!(phones(&Alignment::read(&p).unwrap()), EXPECTED.to_vec(), "{name}");
    }
}

#[test]
fn textgrid_single_interval_tier_without_the_name_phones() {
    let text = SHORT.replace("\"phones\"", "\"segments\"").replace("<exists>\n3", "<exists>\n1");
    // Only the first tier ("words") is read now; the rest is left over and refused.
    let err = Alignment::from_textgrid(&text).unwrap_err().to_string();
    assert!(err.contains("unexpected"), "{err}");
    // A file whose only interval tier has another name: that tier is the phones.
    let only = SHORT.replace(
        "<exists>\n3\n\"IntervalTier\"\n\"words\"\n0\n0.6\n2\n0\n0.1\n\"\"\n0.1\n0.6\n\"bob \"\"the\"\" man\"\n",
        "<exists>\n2\n",
    );
    let only = only.replace("\"phones\"", "\"segments\"");
    assert_eq!(phones(&Alignment::from_textgrid(&only).unwrap()), EXPECTED.to_vec());
    // Two interval tiers and neither is "phones": refused, naming the tiers.
    let two = SHORT.replace("\"phones\"", "\"segments\"");
    let err = Alignment::from_textgrid(&two).unwrap_err().to_string();
    assert!(err.contains("'words'") && err.contains("'segments'") && err.contains("phones"), "{err}");
}

fn tg_err(text: &str) -> String {
    format!("{:#}", Alignment::from_textgrid(text).unwrap_err())
}

#[test]
fn malformed_textgrids_are_refused_with_the_reason() {
    // Not a TextGrid at all.
    assert!(tg_err("hello world").contains("TextGrid"), "{}", tg_err("hello world"));
    assert!(tg_err(&SHORT.replace("\"TextGrid\"", "\"Sound\"")).contains("Sound"));
    // Cut short inside the phone tier.
    let cut = &SHORT[..SHORT.find("\"AA1\"").unwrap()];
    assert!(tg_err(cut).contains("ends early"), "{}", tg_err(cut));
    // A string that is never closed.
    let open = SHORT.replace("\"AA1\"", "\"AA1");
    assert!(tg_err(&open).contains("not closed") || tg_err(&open).contains("expected"), "{}", tg_err(&open));
    // A number where a string belongs (interval text), and a string where a number belongs.
    let num = SHORT.replace("\"AA1\"", "7");
    assert!(tg_err(&num).contains("expected a quoted string"), "{}", tg_err(&num));
    let s = SHORT.replace("0.18\n0.4\n", "\"x\"\n0.4\n");
    assert!(tg_err(&s).contains("expected a number"), "{}", tg_err(&s));
    // A bad number and a non-integer count.
    assert!(tg_err(&SHORT.replace("0.18\n0.4", "0.1.8\n0.4")).contains("not a number"));
    assert!(
        tg_err(&SHORT.replace("\"phones\" ! the phone tier\n0\n0.6\n5", "\"phones\"\n0\n0.6\n4.5")).contains("whole")
    );
    // Unknown tier class.
    assert!(tg_err(&SHORT.replace("\"TextTier\"", "\"PointTier\"")).contains("PointTier"));
    // Interval checks: overlapping, unsorted, empty.
    let overlap = SHORT.replace("0.18\n0.4\n\"AA1\"", "0.15\n0.4\n\"AA1\"");
    let e = tg_err(&overlap);
    assert!(e.contains("overlap") && e.contains("'B'") && e.contains("'AA1'"), "{e}");
    let unsorted = SHORT.replace("0.4\n0.48\n\"B\"", "0.05\n0.08\n\"B\"");
    assert!(tg_err(&unsorted).contains("not sorted"), "{}", tg_err(&unsorted));
    let empty = SHORT.replace("0.18\n0.4\n\"AA1\"", "0.18\n0.18\n\"AA1\"");
    assert!(tg_err(&empty).contains("not after its start"), "{}", tg_err(&empty));
}

#[test]
fn json_alignments_and_their_errors() {
    let a = Alignment::from_json(
        r#"[{"start": 0.1, "end": 0.2, "phoneme": "p", "word": "pa"}, {"start": 0.25, "end": 0.4, "phoneme": "a"}]"#,
    )
    .unwrap();
    assert_eq!(phones(&a), vec![(0.1, 0.2, "p"), (0.25, 0.4, "a")]);
    // Round trip through the writer.
    assert_eq!(Alignment::from_json(&a.to_json()).unwrap(), a);
    for (bad, needle) in [
        (r#"{"start": 0}"#, "JSON list"),
        (r#"[{"start": 0, "end": 1}]"#, "JSON list"),
        (r#"[{"start": 0.3, "end": 0.4, "phoneme": "a"}, {"start": 0.1, "end": 0.2, "phoneme": "p"}]"#, "not sorted"),
        (r#"[{"start": 0.1, "end": 0.3, "phoneme": "a"}, {"start": 0.2, "end": 0.4, "phoneme": "p"}]"#, "overlap"),
        (r#"[{"start": -0.1, "end": 0.3, "phoneme": "a"}]"#, "before 0"),
    ] {
        let e = format!("{:#}", Alignment::from_json(bad).unwrap_err());
        assert!(e.contains(needle), "{bad}: {e}");
    }
}

#[test]
fn times_past_the_end_of_the_audio_are_refused() {
    let a = Alignment::from_textgrid(SHORT).unwrap();
    a.check_duration(0.6).unwrap();
    a.check_duration(0.6 - END_TOLERANCE_S + 1e-6).unwrap();
    let e = a.check_duration(0.5).unwrap_err().to_string();
    assert!(e.contains("past the end") && e.contains("'sil'"), "{e}");
}

#[test]
fn class_table() {
    // ARPAbet with stress digits, including the AH0 (schwa) / AH1 (open) split.
    for (s, c) in [
        ("P", Closure),
        ("B", Closure),
        ("M", Closure),
        ("F", Closure),
        ("V", Closure),
        ("T", Release),
        ("G", Release),
        ("CH", Release),
        ("JH", Release),
        ("AA1", OpenVowel),
        ("AE0", OpenVowel),
        ("AH1", OpenVowel),
        ("AH0", SustainedVowel),
        ("AY2", OpenVowel),
        ("IY1", SustainedVowel),
        ("UW0", SustainedVowel),
        ("OW1", SustainedVowel),
        ("S", OtherConsonant),
        ("NG", OtherConsonant),
        ("W", OtherConsonant),
        ("sil", Silence),
        ("sp", Silence),
        ("", Silence),
        ("spn", OtherConsonant),
    ] {
        assert_eq!(classify(s), Some(c), "{s}");
    }
    // IPA as MFA and espeak-ng write it: stress, length, joiners, aspiration.
    for (s, c) in [
        ("p", Closure),
        ("pʰ", Closure),
        ("ɱ", Closure),
        ("tʃ", Release),
        ("d͡ʒ", Release),
        ("ɡ", Release),
        ("ɾ", Release),
        ("ɑː", OpenVowel),
        ("ˈa", OpenVowel),
        ("a\u{200d}ɪ", OpenVowel),
        ("e\u{200d}ɪ", SustainedVowel),
        ("ə", SustainedVowel),
        ("ɚ", SustainedVowel),
        ("iː", SustainedVowel),
        ("ɹ", OtherConsonant),
        ("ð", OtherConsonant),
        ("_", Silence),
    ] {
        assert_eq!(classify(s), Some(c), "{s}");
    }
    for unknown in ["XX", "@", "ʘ", "pp", "Q1x"] {
        assert_eq!(classify(unknown), None, "{unknown}");
    }
}

#[test]
fn frame_classes_take_the_most_demanding_phoneme_of_each_frame() {
    let a = Alignment::from_textgrid(SHORT).unwrap();
    // 25 fps: frame f spans [0.04 f, 0.04 (f + 1)). B 0.10-0.18 touches frames 2, 3, 4; AA1
    // 0.18-0.40 frames 4..9; B 0.40-0.48 frames 10, 11; sil 0.48-0.60 frames 12..14.
    let fc = a.frame_classes(16, 25.0);
    let want = [
        Silence, Silence, Closure, Closure, Closure, OpenVowel, OpenVowel, OpenVowel, OpenVowel, OpenVowel, Closure,
        Closure,
    ]
    .into_iter()
    .chain([Silence; 4])
    .collect::<Vec<_>>();
    assert_eq!(fc.classes, want);
    assert!(fc.unknown.is_empty() && fc.warning().is_none());
    // Onsets and releases: B at frames 2 (onset) and 4 (release at 0.18 s), B at 10 and 12.
    assert_eq!(a.closure_events(16, 25.0), vec![2, 4, 10, 12]);
}

#[test]
fn unknown_symbols_get_the_default_class_and_one_warning_listing_them() {
    let a = Alignment::from_json(
        r#"[{"start":0,"end":0.1,"phoneme":"XX"},{"start":0.1,"end":0.2,"phoneme":"p"},{"start":0.2,"end":0.3,"phoneme":"XX"},{"start":0.3,"end":0.4,"phoneme":"@"}]"#,
    )
    .unwrap();
    let fc = a.frame_classes(10, 25.0);
    assert_eq!(fc.unknown, vec![("@".to_string(), 1), ("XX".to_string(), 2)]);
    assert_eq!(fc.classes[0], schedules::classes::DEFAULT_CLASS);
    let w = fc.warning().unwrap();
    assert!(w.contains("'@' (x1)") && w.contains("'XX' (x2)") && w.contains("other-consonant"), "{w}");
    // The schedule passes the one warning on.
    let bypassed = vec![false; 10];
    let mut inputs = Inputs::new(25.0, &bypassed);
    inputs.alignment = Some(&a);
    let p = schedules::plan(ScheduleKind::Phonemes, Target::Budget(0.5), &inputs).unwrap();
    assert_eq!(p.warnings, vec![w]);
}

/// Speech runs separated by silence long enough to be bypassed (ramp 4).
fn clip_bypass(n: usize, pauses: &[(usize, usize)]) -> Vec<bool> {
    let speech: Vec<bool> = (0..n).map(|f| !pauses.iter().any(|&(a, b)| (a..b).contains(&f))).collect();
    cadence::schedules::keyframes::bypassed_frames(&cadence::schedules::keyframes::speech_distance(&speech), 4)
}

fn check_rules(p: &Planned, bypassed: &[bool]) {
    let keys = p.schedule.keyframes();
    let n = bypassed.len();
    assert_eq!(keys[0], 0);
    assert_eq!(*keys.last().unwrap() as usize, n - 1);
    for &k in keys {
        let k = k as usize;
        assert!(!bypassed[k] || k == 0 || k == n - 1, "keyframe {k} lies in bypassed silence");
    }
    for (a, b) in active_runs(bypassed) {
        assert!(keys.contains(&(a as u32)) && keys.contains(&(b as u32)), "run {a}..{b} lacks an end keyframe");
    }
    assert_eq!(p.evaluations, keys.iter().filter(|&&k| !bypassed[k as usize]).count());
}

/// A deterministic wiggly signal for the audio and error-bounded inputs.
fn wiggle(n: usize, seed: u64) -> Vec<f32> {
    cadence::measure::fixtures::test_data(n, seed)
}

#[test]
fn every_schedule_keeps_the_rules_and_the_budget_exactly() {
    let n = 300;
    let bypassed = clip_bypass(n, &[(0, 12), (90, 120), (200, 206), (290, 300)]);
    let active = bypassed.iter().filter(|&&b| !b).count();
    let align = Alignment::from_json(
        &serde_json::to_string(
            &(0..(n as f64 / 25.0 / 0.06) as usize)
                .map(|i| {
                    let sym = ["p", "a", "t", "i", "m", "s", "u"][i % 7];
                    serde_json::json!({"start": i as f64 * 0.06, "end": (i + 1) as f64 * 0.06, "phoneme": sym})
                })
                .collect::<Vec<_>>(),
        )
        .unwrap(),
    )
    .unwrap();
    let samples: Vec<f32> = wiggle(n * 640, 3).iter().enumerate().map(|(i, v)| v * ((i / 3000) % 3) as f32).collect();
    let features = wiggle(n * 16, 5);
    let mut inputs = Inputs::new(25.0, &bypassed);
    inputs.alignment = Some(&align);
    inputs.samples_16k = Some(&samples);
    inputs.features = Some((&features, 16));
    for kind in [ScheduleKind::Fixed, ScheduleKind::Phonemes, ScheduleKind::Audio, ScheduleKind::ErrorBounded] {
        for b in [0.25, 1.0 / 3.0, 0.5, 0.9, 1.0] {
            let p = schedules::plan(kind, Target::Budget(b), &inputs).unwrap();
            check_rules(&p, &bypassed);
            assert_eq!(p.evaluations, (b * active as f64).round() as usize, "{kind:?} at budget {b}");
            assert_eq!(p.active_frames, active);
        }
        let p = schedules::plan(kind, Target::Evaluations(37), &inputs).unwrap();
        assert_eq!(p.evaluations, 37);
        // Below what the run ends need: refused, saying why.
        let e = schedules::plan(kind, Target::Evaluations(3), &inputs).unwrap_err().to_string();
        assert!(e.contains("speech runs"), "{kind:?}: {e}");
    }
}

#[test]
fn budgets_outside_0_1_are_refused() {
    let bypassed = vec![false; 50];
    let inputs = Inputs::new(25.0, &bypassed);
    for b in [0.0, -0.1, 1.01, f64::NAN, f64::INFINITY] {
        let e = schedules::plan(ScheduleKind::Fixed, Target::Budget(b), &inputs).unwrap_err().to_string();
        assert!(e.contains("(0, 1]"), "{b}: {e}");
    }
}

#[test]
fn fixed_budget_spreads_keyframes_evenly() {
    // One run of 101 frames, 11 evaluations: 0, 10, 20, ..., 100 exactly (the independent
    // reference: round(j * 100 / 10)).
    let bypassed = vec![false; 101];
    let p = schedules::plan(ScheduleKind::Fixed, Target::Evaluations(11), &Inputs::new(25.0, &bypassed)).unwrap();
    assert_eq!(p.schedule.keyframes(), (0..=10).map(|j| j * 10).collect::<Vec<u32>>().as_slice());
    // 7 evaluations over 0..=100: 100/6 apart, rounded.
    let p = schedules::plan(ScheduleKind::Fixed, Target::Evaluations(7), &Inputs::new(25.0, &bypassed)).unwrap();
    let want: Vec<u32> = (0..=6).map(|j| (j as f64 * 100.0 / 6.0).round() as u32).collect();
    assert_eq!(p.schedule.keyframes(), want.as_slice());
}

#[test]
fn fixed_stride_keeps_gaps_within_the_stride_inside_runs() {
    let bypassed = clip_bypass(200, &[(50, 80)]);
    for k in 1..=6 {
        let p = schedules::plan(ScheduleKind::Fixed, Target::Stride(k), &Inputs::new(25.0, &bypassed)).unwrap();
        check_rules(&p, &bypassed);
        for (a, b) in active_runs(&bypassed) {
            let inside: Vec<u32> =
                p.schedule.keyframes().iter().copied().filter(|&f| (a as u32..=b as u32).contains(&f)).collect();
            assert!(inside.windows(2).all(|w| w[1] - w[0] <= k as u32), "stride {k}: {inside:?}");
            // As few as that allows: ceil(length / k) intervals.
            assert_eq!(inside.len() - 1, (b - a).div_ceil(k), "stride {k}");
        }
    }
}

#[test]
fn phonemes_put_keyframes_at_closure_onsets_and_releases_and_densest_on_closures() {
    let a = Alignment::from_json(
        &serde_json::to_string(
            &(0..40)
                .map(|i| {
                    let (sym, len) = [("b", 0.08), ("a", 0.2), ("m", 0.1), ("i", 0.3)][i % 4];
                    (sym, len)
                })
                .scan(0.0, |t, (sym, len)| {
                    let s = *t;
                    *t += len;
                    Some(serde_json::json!({"start": s, "end": s + len, "phoneme": sym}))
                })
                .collect::<Vec<_>>(),
        )
        .unwrap(),
    )
    .unwrap();
    let n = (a.end() * 25.0).ceil() as usize;
    let bypassed = vec![false; n];
    let mut inputs = Inputs::new(25.0, &bypassed);
    inputs.alignment = Some(&a);
    let events = a.closure_events(n, 25.0);
    let fc = a.frame_classes(n, 25.0);
    for target in [Target::ClassStrides, Target::Budget(0.33)] {
        let p = schedules::plan(ScheduleKind::Phonemes, target, &inputs).unwrap();
        let keys: Vec<usize> = p.schedule.keyframes().iter().map(|&k| k as usize).collect();
        for e in &events {
            assert!(keys.contains(e), "{target:?}: closure event frame {e} is not a keyframe");
        }
        let density = |c: PhonemeClass| {
            let frames: Vec<usize> = (0..n).filter(|&f| fc.classes[f] == c).collect();
            frames.iter().filter(|f| keys.contains(f)).count() as f64 / frames.len() as f64
        };
        assert!(density(Closure) > density(OpenVowel) && density(OpenVowel) > density(SustainedVowel), "{target:?}");
        if target == Target::ClassStrides {
            // Stride 1 on closures: every closure frame is a keyframe.
            assert_eq!(density(Closure), 1.0);
        }
    }
}

#[test]
fn missing_inputs_and_wrong_targets_are_errors() {
    let bypassed = vec![false; 40];
    let inputs = Inputs::new(25.0, &bypassed);
    let e = |k, t| schedules::plan(k, t, &inputs).unwrap_err().to_string();
    assert!(e(ScheduleKind::Phonemes, Target::Budget(0.5)).contains("alignment"));
    assert!(e(ScheduleKind::Audio, Target::Budget(0.5)).contains("audio"));
    assert!(e(ScheduleKind::ErrorBounded, Target::Budget(0.5)).contains("features"));
    assert!(e(ScheduleKind::Fixed, Target::MaxError(0.1)).contains("--stride or --budget"));
    let features = wiggle(40 * 8, 1);
    let mut with = Inputs::new(25.0, &bypassed);
    with.features = Some((&features, 8));
    let err = schedules::plan(ScheduleKind::ErrorBounded, Target::MaxError(0.1), &with).unwrap_err().to_string();
    assert!(err.contains("calibration"), "{err}");
}

#[test]
fn error_bounded_meets_its_bound_and_tightens_with_it() {
    let n = 400;
    let bypassed = clip_bypass(n, &[(150, 190)]);
    // Features that wander fast in one stretch and slowly elsewhere.
    let window = 8;
    let mut features = vec![0.0f32; n * window];
    let mut x = [1.0f32; 8];
    let noise = wiggle(n * window, 9);
    for f in 0..n {
        let speed = if (40..80).contains(&f) { 1.0 } else { 0.05 };
        for (i, xi) in x.iter_mut().enumerate() {
            *xi += speed * noise[f * window + i];
        }
        features[f * window..(f + 1) * window].copy_from_slice(&x);
    }
    let predictor = schedules::FeaturePredictor::new(&features, window).unwrap();
    let mut inputs = Inputs::new(25.0, &bypassed);
    inputs.features = Some((&features, window));
    inputs.error_scale = Some(2.0);
    let mut last = 0;
    for bound in [0.5, 0.2, 0.1, 0.05] {
        let p = schedules::plan(ScheduleKind::ErrorBounded, Target::MaxError(bound), &inputs).unwrap();
        check_rules(&p, &bypassed);
        let keys: Vec<usize> = p.schedule.keyframes().iter().map(|&k| k as usize).collect();
        let worst = predictor.errors(&keys, &bypassed).into_iter().fold(0.0, f64::max);
        assert!(2.0 * worst <= bound, "bound {bound}: predicted worst {}", 2.0 * worst);
        assert!(p.evaluations >= last, "a tighter bound must not need fewer keyframes");
        last = p.evaluations;
        // The fast stretch is keyed more densely than the slow ones.
        let dens = |r: std::ops::Range<usize>| keys.iter().filter(|k| r.contains(k)).count() as f64 / r.len() as f64;
        assert!(dens(40..80) > dens(200..400), "bound {bound}");
    }
    // Features that do not move at all: equal predictions everywhere, evenly bisected.
    let flat = vec![1.0f32; 101 * 4];
    let bypassed = vec![false; 101];
    let mut inputs = Inputs::new(25.0, &bypassed);
    inputs.features = Some((&flat, 4));
    let p = schedules::plan(ScheduleKind::ErrorBounded, Target::Evaluations(5), &inputs).unwrap();
    assert_eq!(p.schedule.keyframes(), &[0, 25, 50, 75, 100]);
}

/// Independent check of the predictor: a network that is linear in its conditioning with
/// orthonormal columns (latent = M F, |M x| = |x|) keeps norms, so the latent infill error of
/// the pipeline's LERP expansion, divided by the features' RMS norm, must equal the prediction.
#[test]
fn predicted_error_is_the_infill_error_of_a_linear_network() {
    use rand::{Rng, SeedableRng};
    let (n, d, w) = (30, 48, 12);
    let mut rng = rand::rngs::StdRng::seed_from_u64(11);
    // M: d x w with orthonormal columns (Gram-Schmidt in f64).
    let mut cols: Vec<Vec<f64>> = Vec::new();
    while cols.len() < w {
        let mut v: Vec<f64> = (0..d).map(|_| rng.random_range(-1.0..1.0)).collect();
        for c in &cols {
            let dot: f64 = v.iter().zip(c).map(|(a, b)| a * b).sum();
            v.iter_mut().zip(c).for_each(|(x, y)| *x -= dot * y);
        }
        let norm = v.iter().map(|x| x * x).sum::<f64>().sqrt();
        cols.push(v.into_iter().map(|x| x / norm).collect());
    }
    let features: Vec<f32> = (0..n * w).map(|_| rng.random_range(-1.0..1.0)).collect();
    let latent: Vec<f32> = (0..n)
        .flat_map(|f| {
            let x = &features[f * w..(f + 1) * w];
            (0..d).map(|i| cols.iter().zip(x).map(|(c, &xj)| c[i] * xj as f64).sum::<f64>() as f32).collect::<Vec<_>>()
        })
        .collect();
    let keys = vec![0usize, 4, 5, 13, 29];
    let schedule = cadence::KeyframeSchedule::explicit(n, &keys).unwrap();
    let key_lat: Vec<f32> = keys.iter().flat_map(|&k| latent[k * d..(k + 1) * d].to_vec()).collect();
    let backend = cadence::Backend::select(cadence::BackendChoice::Cpu).unwrap();
    let expanded = backend.expand(&key_lat, &schedule, d, cadence::Method::Lerp).unwrap();
    let rms = (features.iter().map(|&x| (x as f64).powi(2)).sum::<f64>() / n as f64).sqrt();
    let pred = schedules::FeaturePredictor::new(&features, w).unwrap().errors(&keys, &vec![false; n]);
    for f in 0..n {
        let err = (0..d).map(|i| (expanded[f * d + i] as f64 - latent[f * d + i] as f64).powi(2)).sum::<f64>().sqrt();
        assert!((err / rms - pred[f]).abs() <= 1e-5 * (1.0 + pred[f]), "frame {f}: {} vs {}", err / rms, pred[f]);
        if keys.contains(&f) {
            assert_eq!(pred[f], 0.0);
        } else {
            assert!(pred[f] > 0.01, "frame {f}");
        }
    }
}

#[test]
fn audio_schedule_follows_the_onsets() {
    // Silence-free clip: tone bursts switching every 0.2 s in the first half, one steady tone in
    // the second: the onset strength (spectral flux) is high in the first half only.
    let n = 100;
    let sr = 16_000.0;
    let samples: Vec<f32> = (0..n * 640)
        .map(|i| {
            let t = i as f64 / sr;
            let freq = if t < 2.0 { [300.0, 1200.0, 2500.0][((t / 0.2) as usize) % 3] } else { 600.0 };
            (0.3 * (2.0 * std::f64::consts::PI * freq * t).sin()) as f32
        })
        .collect();
    let bypassed = vec![false; n];
    let mut inputs = Inputs::new(25.0, &bypassed);
    inputs.samples_16k = Some(&samples);
    let onset = schedules::signals::onset_strength(&samples, 25.0, n).unwrap();
    assert_eq!(onset.len(), n);
    let p = schedules::plan(ScheduleKind::Audio, Target::Budget(0.3), &inputs).unwrap();
    let keys = p.schedule.keyframes();
    let first = keys.iter().filter(|&&k| k < 50).count();
    let second = keys.iter().filter(|&&k| k >= 50).count();
    assert!(first > 2 * second, "first half {first} keyframes, second half {second}");
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(64))]
    #[test]
    fn rules_hold_for_random_silences_and_budgets(
        n in 2usize..400,
        pauses in prop::collection::vec((0usize..400, 0usize..60), 0..5),
        budget in 0.05f64..=1.0,
        kind in 0usize..4,
        seed in 0u64..1000,
    ) {
        let pauses: Vec<(usize, usize)> = pauses.into_iter().map(|(a, l)| (a.min(n), (a + l).min(n))).collect();
        let bypassed = clip_bypass(n, &pauses);
        let active = bypassed.iter().filter(|&&b| !b).count();
        let features = wiggle(n * 4, seed);
        let samples = wiggle(n * 640, seed + 1);
        let classes = ["p", "a", "s", "i", "t", ""];
        let align = Alignment::from_json(&serde_json::to_string(&(0..n).map(|f| serde_json::json!({
            "start": f as f64 / 25.0, "end": (f + 1) as f64 / 25.0, "phoneme": classes[(f * 7 + seed as usize) % 6]
        })).collect::<Vec<_>>()).unwrap()).unwrap();
        let mut inputs = Inputs::new(25.0, &bypassed);
        inputs.alignment = Some(&align);
        inputs.samples_16k = Some(&samples);
        inputs.features = Some((&features, 4));
        let kind = [ScheduleKind::Fixed, ScheduleKind::Phonemes, ScheduleKind::Audio, ScheduleKind::ErrorBounded][kind];
        let want = (budget * active as f64).round() as usize;
        match schedules::plan(kind, Target::Budget(budget), &inputs) {
            Ok(p) => {
                check_rules(&p, &bypassed);
                prop_assert_eq!(p.evaluations, want);
            }
            Err(e) => {
                // Only a budget below the run ends may be refused.
                let runs = active_runs(&bypassed);
                let mut ends: Vec<usize> = runs.iter().flat_map(|&(a, b)| [a, b]).collect();
                ends.extend([0, n - 1].into_iter().filter(|&f| !bypassed[f]));
                ends.sort_unstable();
                ends.dedup();
                prop_assert!(want < ends.len(), "refused {want} >= {} needed: {e}", ends.len());
            }
        }
    }
}

#[test]
fn espeak_events_become_intervals() {
    use cadence::schedules::espeak::phoneme_intervals;
    let ev = |v: &[(i64, &str)]| v.iter().map(|&(t, s)| (t, s.to_string())).collect::<Vec<_>>();
    // Each phoneme lasts until the next; two events at one time keep the later one; the last
    // lasts to the end of the audio; an event at the very end is dropped.
    let a =
        phoneme_intervals(&ev(&[(13, "b"), (48, "ɑː"), (225, "l"), (225, "z"), (300, ""), (500, "")]), 0.5).unwrap();
    let got: Vec<(f64, f64, &str)> = a.phones().iter().map(|p| (p.start, p.end, p.phoneme.as_str())).collect();
    assert_eq!(got, vec![(0.013, 0.048, "b"), (0.048, 0.225, "ɑː"), (0.225, 0.3, "z"), (0.3, 0.5, "")]);
    assert!(phoneme_intervals(&ev(&[(100, "a"), (50, "b")]), 1.0).unwrap_err().to_string().contains("out of order"));
    assert!(phoneme_intervals(&ev(&[(100, "a"), (2000, "b"), (2100, "c")]), 1.0)
        .unwrap_err()
        .to_string()
        .contains("past the end"));
}

/// Every symbol of the class table in docs/adaptive_keyframes.md, and every default stride there,
/// against the code: the documentation is the table, the code must agree with it.
#[test]
fn the_documented_class_table_is_the_code() {
    let doc = std::fs::read_to_string(concat!(env!("CARGO_MANIFEST_DIR"), "/../docs/adaptive_keyframes.md")).unwrap();
    let section = &doc[doc.find("## Phoneme classes").unwrap()..];
    let rows: Vec<&str> =
        section.lines().skip_while(|l| !l.starts_with("|---")).skip(1).take_while(|l| l.starts_with('|')).collect();
    assert_eq!(rows.len(), 6, "six classes in the table");
    let defaults = schedules::ClassStrides::default();
    let mut checked = 0;
    for row in rows {
        let cells: Vec<&str> = row.trim_matches('|').split('|').map(str::trim).collect();
        let class = PhonemeClass::ALL
            .into_iter()
            .find(|c| cells[0].starts_with(&c.name().replace('-', " ")))
            .unwrap_or_else(|| panic!("unknown class row {}", cells[0]));
        assert_eq!(cells[1].parse::<f64>().unwrap(), defaults.get(class), "{class} stride");
        for cell in &cells[2..4] {
            for sym in cell.split([' ', ',']).filter(|w| !w.is_empty()) {
                if ["syllabic", "and", "r-coloured"].contains(&sym) {
                    continue;
                }
                let sym = if sym == "\"\"" { "" } else { sym };
                assert_eq!(classify(sym), Some(class), "'{sym}' is listed under {class}");
                checked += 1;
            }
        }
    }
    assert!(checked > 150, "only {checked} symbols checked");
}

#[test]
fn closure_keyframes_that_do_not_fit_the_budget_are_thinned_with_a_warning() {
    // Alternating 0.04 s /p/ and /a/: a closure onset or release in almost every frame.
    let a = Alignment::from_json(
        &serde_json::to_string(
            &(0..100)
                .map(|i| serde_json::json!({"start": i as f64 * 0.04, "end": (i + 1) as f64 * 0.04, "phoneme": (["p", "a"][i % 2])}))
                .collect::<Vec<_>>(),
        )
        .unwrap(),
    )
    .unwrap();
    let bypassed = vec![false; 100];
    let mut inputs = Inputs::new(25.0, &bypassed);
    inputs.alignment = Some(&a);
    let p = schedules::plan(ScheduleKind::Phonemes, Target::Budget(0.2), &inputs).unwrap();
    assert_eq!(p.evaluations, 20);
    check_rules(&p, &bypassed);
    assert_eq!(p.warnings.len(), 1, "{:?}", p.warnings);
    assert!(p.warnings[0].contains("did not fit the budget"), "{}", p.warnings[0]);
    // Thinned evenly: no gap between keyframes is more than twice the mean gap.
    let keys = p.schedule.keyframes();
    let max_gap = keys.windows(2).map(|w| w[1] - w[0]).max().unwrap();
    assert!(max_gap <= 2 * 99 / 19 + 1, "{keys:?}");
}
