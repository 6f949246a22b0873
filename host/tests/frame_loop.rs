//! The frame loop's contract (`cadence::frame_loop::run`), with a toy engine whose keys, infill
//! and decoder are plain numbers, so that what the loop does is all that is tested: every frame
//! reaches the sink once and in order, showing the crop the engine made for it (or the rest crop
//! where the frame is bypassed); the keyframe network runs on the keyframes that are not bypassed
//! and only on them, in the same batches whatever the window; decoder runs hold at most the
//! engine's batch, never a bypassed frame, and are the same runs whatever the window. The
//! expected frames are composited here directly from the toy engine's formula, not by the loop.

use cadence::backend::composite::Compositor;
use cadence::backend::resident::Residency;
use cadence::frame_loop::{self, ClipPart, FrameEngine, RenderOptions, StageTimes, Window};
use cadence::schedules::keyframes::{bypassed_frames, speech_distance};
use cadence::{Backend, ColorMatrix, KeyframeSchedule, RgbRange};
use cadence_engines::{Device, Tensor};
use cadence_media::FaceBox;
use std::ops::Range;

const SIDE: usize = 8;
const FRAME: (usize, usize) = (32, 24);

/// The toy engine: a keyframe's key is its frame index; a frame between keyframes gets the
/// linear interpolation of its interval's keys; its crop is that value / 100 everywhere. Rest
/// keys are -1 and the rest crop is 0.9.
struct Toy {
    batch: usize,
    values: Vec<Option<f32>>,
    evaluated: Vec<Vec<usize>>,
    decoded: Vec<Range<usize>>,
    rest: Tensor,
}

impl Toy {
    fn new(n: usize, batch: usize) -> Toy {
        Toy {
            batch,
            values: vec![None; n],
            evaluated: Vec::new(),
            decoded: Vec::new(),
            rest: Tensor::full(0.9f32, (1, 3, SIDE, SIDE), &Device::Cpu).unwrap(),
        }
    }
}

impl FrameEngine for Toy {
    type Key = f32;

    fn key_batch(&self) -> usize {
        self.batch
    }

    fn decode_batch(&self) -> usize {
        self.batch
    }

    fn evaluate(&mut self, frames: &[usize], _: &mut StageTimes) -> anyhow::Result<Vec<f32>> {
        self.evaluated.push(frames.to_vec());
        Ok(frames.iter().map(|&f| f as f32).collect())
    }

    fn rest_key(&self, _: usize) -> anyhow::Result<f32> {
        Ok(-1.0)
    }

    fn infill(&mut self, w: &Window<'_, f32>, _: &mut StageTimes) -> anyhow::Result<()> {
        assert!(w.end <= w.frames.end && w.frames.start < w.end, "window {:?} hands out ..{}", w.frames, w.end);
        let positions = w.schedule.frame_positions();
        let m = w.schedule.keyframes().len();
        for (f, &(j, alpha)) in positions.iter().enumerate().take(w.end).skip(w.frames.start) {
            let key = |j: usize| w.keys[j - w.first_key];
            let v = if m == 1 || alpha == 0.0 { key(j) } else { key(j) + alpha * (key(j + 1) - key(j)) };
            assert!(self.values[f].is_none(), "frame {f} infilled twice");
            self.values[f] = Some(v);
        }
        Ok(())
    }

    fn decode(&mut self, run: Range<usize>, _: &mut StageTimes) -> anyhow::Result<Tensor> {
        self.decoded.push(run.clone());
        let data: Vec<f32> = run
            .clone()
            .flat_map(|f| {
                std::iter::repeat_n(self.values[f].expect("decoded after its infill") / 100.0, 3 * SIDE * SIDE)
            })
            .collect();
        Ok(Tensor::from_vec(data, (run.len(), 3, SIDE, SIDE), &Device::Cpu)?)
    }

    fn release(&mut self, _: usize) -> anyhow::Result<()> {
        Ok(())
    }

    fn rest_crop(&self, _: usize) -> &Tensor {
        &self.rest
    }

    fn crop_range(&self) -> RgbRange {
        RgbRange::Unit
    }

    fn decoded_frames(&self) -> usize {
        self.decoded.iter().map(|r| r.len()).sum()
    }

    fn residency(&self) -> Residency {
        Residency::Host
    }
}

fn compositor() -> Compositor {
    let (w, h) = FRAME;
    let bg: Vec<u8> = (0..w * h * 3).map(|i| (i * 7 % 251) as u8).collect();
    Compositor::new(&Backend::Cpu, &bg, w, h, FaceBox { x: 4, y: 2, w: 16, h: 16 }, 2.0, ColorMatrix::Bt709).unwrap()
}

/// The frame a crop of one value makes, composited directly.
fn expected_frame(c: &Compositor, value: f32) -> Vec<u8> {
    let mut out = vec![0u8; c.frame_bytes()];
    c.compose(&vec![value; 3 * SIDE * SIDE], SIDE, SIDE, RgbRange::Unit, &mut out);
    out
}

struct Run {
    frames: Vec<Vec<u8>>,
    evaluated: Vec<Vec<usize>>,
    decoded: Vec<Range<usize>>,
    stats: cadence::frame_loop::RenderStats,
    /// The last keyframe's key, as `run_carrying` hands it on.
    last_key: Option<f32>,
}

fn run(schedule: &KeyframeSchedule, speech: &[bool], batch: usize, window: Option<usize>) -> Run {
    run_carrying(schedule, speech, batch, window, None)
}

fn run_carrying(
    schedule: &KeyframeSchedule,
    speech: &[bool],
    batch: usize,
    window: Option<usize>,
    carried: Option<f32>,
) -> Run {
    let n = schedule.n_frames();
    let distance = speech_distance(speech);
    let c = compositor();
    let mut toy = Toy::new(n, batch);
    let opts = RenderOptions { batch, window, ..RenderOptions::default() };
    let mut frames = Vec::new();
    let (stats, last_key) = frame_loop::run_carrying(
        &mut toy,
        &Backend::Cpu,
        &opts,
        ClipPart::whole(&distance),
        schedule,
        std::slice::from_ref(&c),
        carried,
        |i, f| {
            assert_eq!(i, frames.len(), "frames reach the sink in order");
            frames.push(f.to_vec());
            Ok(())
        },
        |_| {},
    )
    .unwrap();
    Run { frames, evaluated: toy.evaluated, decoded: toy.decoded, stats, last_key }
}

/// Speech, a pause long enough to bypass (12 frames with a ramp of 4), speech again.
fn speech(n: usize) -> Vec<bool> {
    (0..n).map(|f| !(20..32).contains(&f)).collect()
}

#[test]
fn every_frame_shows_its_crop_and_bypassed_frames_the_rest_crop() {
    let n = 47;
    let speech = speech(n);
    let bypassed = bypassed_frames(&speech_distance(&speech), 4);
    assert!(bypassed.iter().any(|&b| b) && !bypassed[0], "the clip has a bypassed pause");
    let c = compositor();
    for stride in [1, 2, 3, 5, 50] {
        let schedule = KeyframeSchedule::fixed_stride(n, stride).unwrap();
        let r = run(&schedule, &speech, 3, Some(7));
        assert_eq!(r.frames.len(), n);
        // The toy's formula, written out: each frame's value from its keyframe interval, rest
        // keys where a keyframe is bypassed.
        let keys = schedule.keyframes();
        let key_value = |j: usize| if bypassed[keys[j] as usize] { -1.0 } else { keys[j] as f32 };
        for (f, (j, alpha)) in schedule.frame_positions().into_iter().enumerate() {
            let want = if bypassed[f] {
                expected_frame(&c, 0.9)
            } else {
                let v = if keys.len() == 1 || alpha == 0.0 {
                    key_value(j)
                } else {
                    key_value(j) + alpha * (key_value(j + 1) - key_value(j))
                };
                expected_frame(&c, v / 100.0)
            };
            assert!(r.frames[f] == want, "stride {stride}: frame {f}");
        }
        let live: Vec<usize> = keys.iter().map(|&k| k as usize).filter(|&k| !bypassed[k]).collect();
        assert_eq!(r.evaluated.concat(), live, "stride {stride}: the network runs on the live keyframes, once each");
        assert_eq!(r.stats.keyframes_evaluated, live.len());
        assert_eq!(r.stats.bypassed_frames, bypassed.iter().filter(|&&b| b).count());
        for run in &r.decoded {
            assert!(run.len() <= 3, "stride {stride}: decoder run {run:?} exceeds the batch");
            assert!(run.clone().all(|f| !bypassed[f]), "stride {stride}: decoder run {run:?} holds a bypassed frame");
        }
        assert_eq!(r.stats.decoded_frames, n - r.stats.bypassed_frames);
    }
}

#[test]
fn the_window_changes_no_frame_no_batch_and_no_decoder_run() {
    let n = 61;
    let speech = speech(n);
    for schedule in [
        KeyframeSchedule::fixed_stride(n, 3).unwrap(),
        KeyframeSchedule::explicit(n, &[0, 1, 2, 9, 10, 17, 33, 34, 40, 60]).unwrap(),
    ] {
        let whole = run(&schedule, &speech, 4, None);
        for window in [1, 2, 5, 13, 200] {
            let w = run(&schedule, &speech, 4, Some(window));
            assert!(w.frames == whole.frames, "window {window}: frames differ");
            assert_eq!(w.evaluated, whole.evaluated, "window {window}: keyframe batches differ");
            assert_eq!(w.decoded, whole.decoded, "window {window}: decoder runs differ");
        }
    }
}

#[test]
fn one_frame_and_one_keyframe() {
    let one = run(&KeyframeSchedule::fixed_stride(1, 3).unwrap(), &[true], 8, Some(4));
    let one_run: Vec<Range<usize>> = std::iter::once(0..1).collect();
    assert_eq!((one.frames.len(), one.evaluated, one.decoded), (1, vec![vec![0]], one_run));
    let silent = run(&KeyframeSchedule::fixed_stride(9, 4).unwrap(), &[false; 9], 8, None);
    assert_eq!(silent.frames.len(), 9);
    assert!(silent.evaluated.is_empty() && silent.decoded.is_empty(), "silence runs no network");
    assert!(silent.frames.iter().all(|f| *f == expected_frame(&compositor(), 0.9)));
}

#[test]
fn a_carried_key_stands_for_frame_0_and_the_last_key_is_handed_on() {
    let n = 25;
    let schedule = KeyframeSchedule::fixed_stride(n, 12).unwrap();
    let speech = vec![true; n];
    let c = compositor();
    let plain = run(&schedule, &speech, 8, Some(12));
    assert_eq!((plain.evaluated.concat(), plain.last_key), (vec![0, 12, 24], Some(24.0)));

    // The key the part before made for frame 0 is the one the network would make: the same
    // frames, without evaluating frame 0 again.
    let same = run_carrying(&schedule, &speech, 8, Some(12), Some(0.0));
    assert!(same.frames == plain.frames, "a carried key equal to frame 0's changed the frames");
    assert_eq!(same.evaluated.concat(), vec![12, 24], "frame 0 was evaluated again");
    assert_eq!((same.stats.keyframes_evaluated, same.last_key), (2, Some(24.0)));

    // Another key: frame 0 and the frames up to keyframe 12 are made from it.
    let other = run_carrying(&schedule, &speech, 8, Some(12), Some(100.0));
    assert!(other.frames[0] == expected_frame(&c, 1.0), "frame 0 does not show the carried key");
    assert!(other.frames[6] == expected_frame(&c, 0.56), "frame 6 is not between the carried key and 12");
    assert!(other.frames[12..] == plain.frames[12..]);

    // Frame 0 bypassed here: its rest key, whatever was carried; a bypassed last keyframe hands
    // nothing on.
    let silence_first: Vec<bool> = (0..n).map(|f| f >= 14).collect();
    let rest = run_carrying(&schedule, &silence_first, 8, Some(12), Some(100.0));
    assert!(rest.frames[0] == expected_frame(&c, 0.9), "a bypassed frame 0 showed the carried key");
    let silence_last: Vec<bool> = (0..n).map(|f| f < 10).collect();
    assert_eq!(run_carrying(&schedule, &silence_last, 8, Some(12), Some(0.0)).last_key, None);

    // One frame, one keyframe: the carried key is the render's only and last key.
    let one = run_carrying(&KeyframeSchedule::fixed_stride(1, 3).unwrap(), &[true], 8, None, Some(0.0));
    assert!(one.evaluated.is_empty());
    assert_eq!(one.last_key, Some(0.0));
}
