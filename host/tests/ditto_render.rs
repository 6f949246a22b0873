//! The Ditto render loop on the cpu-reduced profile with synthetic weights: keyframes of a
//! strided render are the dense render's frames bit for bit, whatever the infill; sustained
//! silence shows the rest frame and runs no network; the networks run exactly where the
//! schedule and the infill say.

use cadence::ditto::{self, DittoAvatar, DittoEngines, DittoInfill};
use cadence::{Backend, KeyframeSchedule, Method};
use cadence_engines::Profile;
use std::sync::OnceLock;

const FRAMES: usize = 30;
/// Speech on frames [0, SPEECH), silence after: with a ramp of 4, frames SPEECH + 3.. are bypassed.
const SPEECH: usize = 12;
const RAMP: u32 = 4;

struct Setup {
    engines: DittoEngines,
    avatar: DittoAvatar,
    kp: Vec<f32>,
    distance: Vec<u32>,
}

fn setup() -> &'static Setup {
    static S: OnceLock<Setup> = OnceLock::new();
    S.get_or_init(|| {
        let engines = DittoEngines::load(Profile::Cpu, None).unwrap();
        let (w, h) = (192u32, 224u32);
        let px: Vec<u8> = (0..w * h)
            .flat_map(|i| [(i % w * 5 % 256) as u8, (i / w * 3 % 256) as u8, ((i * 11) % 256) as u8])
            .collect();
        let img = cadence_media::RgbImage::from_raw(w, h, px).unwrap();
        let face = cadence::avatar::face_box(&img, None).unwrap();
        let avatar = ditto::prepare_avatar(&engines, &Backend::Cpu, &img, face).unwrap();
        let width = engines.audio_feature_width();
        let features: Vec<f32> = (0..FRAMES * width).map(|i| ((i * 7919) % 1009) as f32 / 504.5 - 1.0).collect();
        let motion = ditto::sample_motion(&engines, &avatar, &features, 2).unwrap();
        let speech: Vec<bool> = (0..FRAMES).map(|f| f < SPEECH).collect();
        let distance = cadence::schedules::keyframes::speech_distance(&speech);
        let kp = ditto::driving_keypoints(&engines, &avatar, &motion[..265], &motion, &distance, RAMP).unwrap();
        Setup { engines, avatar, kp, distance }
    })
}

fn render(schedule: &KeyframeSchedule, infill: DittoInfill) -> (Vec<Vec<u8>>, cadence::frame_loop::RenderStats) {
    let s = setup();
    let mut frames = Vec::new();
    let stats = ditto::frames::render(
        &s.engines,
        &s.avatar,
        &s.kp,
        &s.distance,
        RAMP,
        schedule,
        infill,
        Method::Slerp,
        |i, f| {
            assert_eq!(i, frames.len(), "frames arrive in order");
            frames.push(f.to_vec());
            Ok(())
        },
        |_| {},
    )
    .unwrap();
    (frames, stats)
}

/// The synthetic extractor's keypoints lie where a trained one's do, inside the feature volume
/// the warp samples (x, y in [−1, 1]); and speech moves them by hundredths, not by the volume.
#[test]
fn synthetic_keypoints_fall_inside_the_feature_volume() {
    let s = setup();
    let x_s = s.avatar.source_keypoints();
    assert!(x_s.iter().all(|v| v.abs() < 1.2), "{x_s:?}");
    let far = s.kp.iter().zip(x_s.iter().cycle()).map(|(a, b)| (a - b).abs()).fold(0f32, f32::max);
    assert!(far > 1e-3 && far < 0.3, "driving keypoints move {far} from the source's");
}

#[test]
fn silence_eases_to_the_rest_keypoints_and_stays_there() {
    let s = setup();
    let per = 63;
    let row = |f: usize| &s.kp[f * per..(f + 1) * per];
    // Frame 0 drives nothing (relative to itself): it is the rest state, and so is every frame
    // of sustained silence.
    for f in SPEECH + RAMP as usize - 1..FRAMES {
        assert_eq!(row(f), row(0), "frame {f}");
    }
    assert!((1..SPEECH).any(|f| row(f) != row(0)), "speech moves the keypoints");
}

#[test]
fn strided_keyframes_are_the_dense_frames_and_silence_is_the_rest_frame() {
    let dense_schedule = KeyframeSchedule::fixed_stride(FRAMES, 1).unwrap();
    let (dense, dense_stats) = render(&dense_schedule, DittoInfill::Feature);
    assert_eq!(dense.len(), FRAMES);
    let bypassed: Vec<usize> = (0..FRAMES).filter(|&f| setup().distance[f] >= RAMP).collect();
    assert_eq!(dense_stats.bypassed_frames, bypassed.len());
    assert_eq!(dense_stats.keyframes_evaluated, FRAMES - bypassed.len());
    for &f in &bypassed[1..] {
        assert!(dense[f] == dense[bypassed[0]], "bypassed frame {f} is the rest frame");
    }
    let schedule = KeyframeSchedule::fixed_stride(FRAMES, 3).unwrap();
    let keys: Vec<usize> = schedule.keyframes().iter().map(|&k| k as usize).collect();
    let live_keys = keys.iter().filter(|&&k| setup().distance[k] < RAMP).count();
    for infill in [DittoInfill::Feature, DittoInfill::Image, DittoInfill::Motion] {
        let (frames, stats) = render(&schedule, infill);
        assert_eq!(frames.len(), FRAMES);
        for &k in &keys {
            assert!(frames[k] == dense[k], "{infill:?}: keyframe {k} differs from the dense render");
        }
        for &f in &bypassed {
            assert!(frames[f] == dense[f], "{infill:?}: bypassed frame {f}");
        }
        assert_eq!(stats.keyframes_evaluated, live_keys, "{infill:?}: warp runs on live keyframes only");
        let between = (0..FRAMES).filter(|f| !keys.contains(f) && setup().distance[*f] < RAMP).count();
        let want_decoded = match infill {
            DittoInfill::Feature => live_keys + between,
            DittoInfill::Image | DittoInfill::Motion => live_keys,
        };
        assert_eq!(stats.decoded_frames, want_decoded, "{infill:?}: decoder runs");
        // Between keyframes in speech the infill made something of its own.
        let differ = (1..SPEECH).filter(|f| !keys.contains(f)).filter(|&f| frames[f] != frames[f - 1]).count();
        assert!(differ > 0, "{infill:?}: infilled frames are not copies");
    }
}

#[test]
fn user_features_are_checked() {
    let w = setup().engines.audio_feature_width();
    let good = vec![0.0f32; 3 * w];
    ditto::check_features(&good, &[3, w], w, 3, "f.npy").unwrap();
    let e = ditto::check_features(&good, &[3, w], w, 4, "f.npy").unwrap_err().to_string();
    assert!(e.contains("3 frames of audio features for 4 video frames"), "{e}");
    let e = ditto::check_features(&good, &[w, 3], w, 3, "f.npy").unwrap_err().to_string();
    assert!(e.contains("takes (frames, 256)"), "{e}");
    let mut nan = good.clone();
    nan[w + 2] = f32::NAN;
    let e = ditto::check_features(&nan, &[3, w], w, 3, "f.npy").unwrap_err().to_string();
    assert!(e.contains("(frame 1) is NaN"), "{e}");
}
