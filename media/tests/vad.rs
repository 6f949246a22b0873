mod common;

use cadence_media::vad::hop_activity;
use cadence_media::{frame_count, load_wav, voice_activity, VadConfig};
use common::*;

const FPS: f64 = 25.0;

#[test]
fn frame_count_is_ceil() {
    assert_eq!(frame_count(2.0, 25.0), 50);
    assert_eq!(frame_count(2.0001, 25.0), 51);
    assert_eq!(frame_count(0.04, 25.0), 1);
    assert_eq!(frame_count(0.041, 25.0), 2);
    assert_eq!(frame_count(10.0 / 3.0, 30.0), 100);
    assert_eq!(frame_count(0.0, 25.0), 0);
}

#[test]
fn digital_silence_and_faint_noise_are_silence() {
    let zeros = vec![0f32; 32_000];
    assert!(voice_activity(&zeros, FPS, 50).iter().all(|v| !v));
    // Noise at about -70 dBFS: below the absolute floor.
    let mut x = 12345u32;
    let noise: Vec<f32> = (0..32_000)
        .map(|_| {
            x = x.wrapping_mul(1664525).wrapping_add(1013904223);
            ((x >> 8) as f32 / (1u32 << 24) as f32 - 0.5) * 0.001
        })
        .collect();
    assert!(voice_activity(&noise, FPS, 50).iter().all(|v| !v));
}

#[test]
fn short_gaps_are_bridged_long_pauses_are_not() {
    // 300 ms tone, 120 ms gap (plosive-like), 300 ms tone, 1 s silence, 300 ms tone.
    let tone = |n: usize| -> Vec<f32> { (0..n).map(|i| 0.3 * (i as f32 * 0.2).sin()).collect() };
    let mut s = tone(4800);
    s.extend(vec![0.0; 1920]);
    s.extend(tone(4800));
    s.extend(vec![0.0; 16_000]);
    s.extend(tone(4800));
    let hops = hop_activity(&s, &VadConfig::default());
    // The 120 ms gap (hops 30..42) is speech thanks to the hangover.
    assert!(hops[30..42].iter().all(|&v| v));
    // Inside the 1 s pause, after the 200 ms hangover: silence.
    let pause_start = 72; // hop index where the pause begins
    assert!(hops[pause_start + 21..pause_start + 100].iter().all(|&v| !v));
    // A 10 ms click is ignored.
    let mut click = vec![0f32; 16_000];
    click[8000..8160].iter_mut().for_each(|v| *v = 0.5);
    assert!(voice_activity(&click, FPS, 25).iter().all(|v| !v));
}

#[test]
fn relative_threshold_quiet_recording() {
    // Same signal 30 dB quieter gives the same decisions.
    let mut s: Vec<f32> = (0..8000).map(|i| 0.3 * (i as f32 * 0.2).sin()).collect();
    s.extend(vec![0.0; 16_000]);
    s.extend((0..8000).map(|i| 0.3 * (i as f32 * 0.2).sin()));
    let quiet: Vec<f32> = s.iter().map(|v| v * 0.0316).collect();
    assert_eq!(voice_activity(&s, FPS, 50), voice_activity(&quiet, FPS, 50));
}

/// First and last sample above 1% of full scale: where the fixture's speech starts and ends.
fn speech_span(s: &[i16]) -> (usize, usize) {
    let first = s.iter().position(|v| v.unsigned_abs() > 327).unwrap();
    let last = s.len() - 1 - s.iter().rev().position(|v| v.unsigned_abs() > 327).unwrap();
    (first, last)
}

#[test]
fn espeak_sentence_pause_sentence() {
    let dir = tmp_dir("vad-espeak");
    let (rate, a) = speech_fixture("fox"); // "The quick brown fox jumps over the lazy dog"
    let (rate_b, b) = speech_fixture("sleep"); // "Then everybody went home to sleep"
    assert_eq!(rate, rate_b);
    let (a0, a1) = speech_span(&a);
    let (b0, b1) = speech_span(&b);
    // Exactly 2 s of silence between the end of sentence A's speech and the start of B's.
    let mut s: Vec<i16> = a[..=a1].to_vec();
    s.extend(vec![0i16; 2 * rate as usize]);
    let b_start = s.len();
    s.extend_from_slice(&b[b0..]);
    let path = dir.join("speech.wav");
    let spec =
        hound::WavSpec { channels: 1, sample_rate: rate, bits_per_sample: 16, sample_format: hound::SampleFormat::Int };
    let mut w = hound::WavWriter::create(&path, spec).unwrap();
    s.iter().for_each(|&v| w.write_sample(v).unwrap());
    w.finalize().unwrap();

    let audio = load_wav(&path).unwrap();
    let n = frame_count(audio.duration_s, FPS);
    let vad = voice_activity(&audio.samples_16k, FPS, n);
    assert_eq!(vad.len(), n);
    let t = |i: usize| i as f64 / rate as f64;
    let (sa0, sa1) = (t(a0), t(a1));
    let (pause0, pause1) = (t(a1), t(b_start));
    let (sb0, sb1) = (t(b_start), t(b_start + (b1 - b0)));
    let frames_in = |lo: f64, hi: f64| -> Vec<usize> {
        (0..n).filter(|&i| i as f64 / FPS >= lo && (i + 1) as f64 / FPS <= hi).collect()
    };
    // The pause, past the 200 ms hangover (plus a frame), is silence: every frame of it.
    let pause = frames_in(pause0 + 0.25, pause1 - 0.01);
    assert!(pause.len() >= 40, "{} pause frames", pause.len());
    let wrong: Vec<usize> = pause.iter().copied().filter(|&i| vad[i]).collect();
    assert!(wrong.is_empty(), "pause frames marked speech: {wrong:?}");
    // The sentences are speech: at least 95% of their frames (and most likely all).
    for (lo, hi, name) in [(sa0, sa1, "A"), (sb0, sb1, "B")] {
        let fr = frames_in(lo, hi);
        let speech = fr.iter().filter(|&&i| vad[i]).count();
        println!("sentence {name}: {speech}/{} frames speech", fr.len());
        assert!(fr.len() > 25);
        assert!(
            speech as f64 >= 0.95 * fr.len() as f64,
            "sentence {name}: only {speech} of {} frames speech: {:?}",
            fr.len(),
            fr.iter().map(|&i| vad[i] as u8).collect::<Vec<_>>()
        );
    }
    let bypassed = vad.iter().filter(|v| !**v).count();
    println!("{n} frames, {bypassed} silent");
}

/// Hop levels accumulated from pieces equal the whole signal's, and voice activity from them
/// equals voice activity from the signal.
#[test]
fn hop_levels_in_pieces_equal_the_whole_signal() {
    use cadence_media::vad::hop_levels_db;
    use cadence_media::{voice_activity_from_levels, HopLevels};
    let wav = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/speech/goodnight.wav");
    let x = load_wav(&wav).unwrap().samples_16k;
    let cfg = VadConfig::default();
    let whole = hop_levels_db(&x, &cfg);
    let mut levels = HopLevels::new(&cfg);
    let mut at = 0;
    for len in [1usize, 159, 0, 160, 161, 1000, 37].iter().cycle() {
        if at >= x.len() {
            break;
        }
        let end = (at + len).min(x.len());
        levels.push(&x[at..end]);
        at = end;
    }
    let pieces = levels.finish();
    assert_eq!(pieces, whole);
    let frames = frame_count(x.len() as f64 / 16_000.0, FPS);
    assert_eq!(voice_activity_from_levels(&pieces, FPS, frames, &cfg), voice_activity(&x, FPS, frames));
}
