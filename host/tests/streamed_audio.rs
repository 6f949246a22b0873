//! A render that reads its WAV as it goes ([`StreamedAudio`]) against one that decoded the WAV
//! whole first: the same voice activity, the same frames, the same fragmented MP4 bytes (video
//! and AAC track), over a clip longer than whisper's 30 s segment; and a file that changes
//! under the render is an error, not a short track.

use cadence::frame_loop::audio::{ClipAudio, StreamedAudio};
use cadence::frame_loop::video::{Output, Sink};
use cadence::frame_loop::RenderOptions;
use cadence::musetalk::{DecoderKind, Engines};
use cadence::{Backend, KeyframeSchedule};
use cadence_engines::{ClipSamples, Device, Profile};
use cadence_media::{EncoderKind, RgbImage};
use std::path::Path;

/// 31.2 s of 44.1 kHz stereo (resampled for the analysis, muxed at its own rate): silence,
/// which the render bypasses, except speech-like tones at the start and across the 30 s
/// segment boundary, different in the two channels.
fn write_clip(path: &Path) {
    let spec = hound::WavSpec {
        channels: 2,
        sample_rate: 44_100,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(path, spec).unwrap();
    let tau = 2.0 * std::f32::consts::PI;
    for i in 0..(44_100.0 * 31.2) as usize {
        let t = i as f32 / 44_100.0;
        let speaking = t < 1.0 || (28.8..30.9).contains(&t);
        for c in 0..2 {
            let v = if speaking {
                0.3 * (t * tau * (150.0 + 25.0 * c as f32 + 30.0 * (t * tau).sin())).sin()
                    * (0.6 + 0.4 * (t * tau * 3.0).sin())
            } else {
                0.0
            };
            w.write_sample((v * 32767.0).round() as i16).unwrap();
        }
    }
    w.finalize().unwrap();
}

#[test]
fn streamed_audio_renders_the_same_fragmented_mp4_as_audio_decoded_whole() {
    let dir = tempfile::tempdir().unwrap();
    let wav = dir.path().join("clip.wav");
    write_clip(&wav);
    let engines = Engines::load(Profile::Cpu, DecoderKind::Taesd, &Device::Cpu, None).unwrap();
    let (w, h) = (320u32, 256u32);
    let px: Vec<u8> = (0..w * h * 3).map(|i| (i * 37 % 251) as u8).collect();
    let img = RgbImage::from_raw(w, h, px).unwrap();
    let face = cadence::avatar::face_box(&img, None).unwrap();
    // The clip's "speech" is tones, which Silero rightly calls silence: the energy detector
    // decides here (Silero's streamed decisions are checked on real speech below).
    let vad = cadence::frame_loop::audio::Vad::Energy;
    let opts = RenderOptions { batch: 4, window: Some(20), vad, ..RenderOptions::default() };

    let whole = cadence::musetalk::render::prepare(
        &engines,
        &Backend::Cpu,
        cadence::frame_loop::audio::load_audio(&wav, 60.0).unwrap(),
        &img,
        face,
        &opts,
    );
    let streamed = StreamedAudio::open(&wav, 60.0, &vad).unwrap();
    let streamed = cadence::musetalk::render::prepare(&engines, &Backend::Cpu, streamed, &img, face, &opts);
    let (whole, streamed) = (whole.unwrap(), streamed.unwrap());
    assert!(matches!(streamed.audio, ClipAudio::Streamed(_)));
    assert_eq!(streamed.frames, whole.frames);
    assert_eq!(streamed.audio.track_frames(), whole.audio.track_frames());
    assert_eq!(streamed.audio.track_format(), whole.audio.track_format());
    assert_eq!(streamed.speech, whole.speech, "voice activity from the streamed levels differs");
    assert!(whole.speech.iter().any(|&s| s) && whole.speech.iter().any(|&s| !s));

    let schedule = KeyframeSchedule::fixed_stride(whole.frames, 3).unwrap();
    let mp4 = |prepared: &cadence::musetalk::render::Prepared| {
        let mut bytes = Vec::new();
        let out = Output::Fragmented {
            sink: Sink::Writer { out: &mut bytes, name: "memory" },
            encoder: EncoderKind::OpenH264,
            pace: false,
        };
        let r =
            cadence::musetalk::render::render_clip(&engines, &Backend::Cpu, &opts, prepared, &schedule, out, |_| {})
                .unwrap();
        assert!(r.video.unwrap().has_audio);
        bytes
    };
    let (a, b) = (mp4(&whole), mp4(&streamed));
    assert!(!a.is_empty());
    assert!(a == b, "the fragmented MP4 from the streamed WAV differs from the whole WAV's");
}

/// The WAV is read twice (levels first, samples during the render); a file cut short in
/// between is an error naming it when the render reaches the missing samples.
#[test]
fn a_wav_cut_short_after_opening_is_an_error_not_a_short_clip() {
    let dir = tempfile::tempdir().unwrap();
    let wav = dir.path().join("clip.wav");
    write_clip(&wav);
    let audio = StreamedAudio::open(&wav, 60.0, &cadence::frame_loop::audio::Vad::default()).unwrap();
    let n = audio.samples_16k();
    let bytes = std::fs::read(&wav).unwrap();
    std::fs::write(&wav, &bytes[..bytes.len() / 2]).unwrap();
    let mut out = Vec::new();
    let err = audio.read_samples(0, n, &mut out).unwrap_err().to_string();
    assert!(err.contains("clip.wav"), "{err}");
    // And a file cut inside a sample frame is refused when opened.
    std::fs::write(&wav, &bytes[..bytes.len() - 1]).unwrap();
    let err = format!(
        "{:#}",
        StreamedAudio::open(&wav, 60.0, &cadence::frame_loop::audio::Vad::default()).err().expect("a cut file opened")
    );
    assert!(err.contains("clip.wav") && err.contains("truncated"), "{err}");
}

/// Voice activity by Silero from a WAV read as it goes (the probabilities made chunk by chunk
/// in the first pass) is Silero's on the clip decoded whole, frame for frame, at two frame
/// rates, with and without the front end; and the clip (speech with breaths, tones, noise and
/// pauses) is one where the two detectors disagree, so the choice is seen. A WAV opened for one
/// front end setting refuses to decide with the other.
#[test]
fn streamed_and_whole_audio_get_the_same_silero_decisions() {
    use cadence::frame_loop::audio::Vad;
    use cadence_media::SileroConfig;
    let wav = Path::new(env!("CARGO_MANIFEST_DIR")).join("../fixtures/vad/mix_16k.wav");
    let whole: ClipAudio = cadence::frame_loop::audio::load_audio(&wav, 600.0).unwrap().into();
    let raw = Vad::Silero(SileroConfig { denoise: false, ..SileroConfig::default() });
    for silero in [Vad::default(), raw] {
        let Vad::Silero(cfg) = silero else { unreachable!() };
        let streamed: ClipAudio = StreamedAudio::open(&wav, 600.0, &silero).unwrap().into();
        for fps in [25.0, 30.0] {
            let n = whole.video_frames(fps);
            let a = whole.voice_activity(fps, n, &silero).unwrap();
            assert_eq!(a, streamed.voice_activity(fps, n, &silero).unwrap(), "{fps} fps, {cfg:?}");
            let samples = cadence_media::load_wav(&wav).unwrap().samples_16k;
            let want = cadence_media::vad::silero::try_voice_activity_with(&samples, fps, n, &cfg).unwrap();
            assert_eq!(a, want, "{fps} fps: the render's decisions are media's Silero decisions");
            let energy = whole.voice_activity(fps, n, &Vad::Energy).unwrap();
            assert!(a.iter().zip(&energy).any(|(s, e)| s != e), "{fps} fps: Silero and energy agree everywhere");
            assert!(a.iter().any(|&s| s) && a.iter().any(|&s| !s), "{fps} fps: speech and silence");
        }
        let other = Vad::Silero(SileroConfig { denoise: !cfg.denoise, ..cfg });
        let err = streamed.voice_activity(25.0, 10, &other).unwrap_err().to_string();
        assert!(err.contains("front end"), "{err}");
    }
}

/// Digital silence decides a WAV read as it goes as it decides the WAV decoded whole, and as
/// `cadence_media`'s detector decides its samples: 16 kHz mono, tones between runs of exact
/// zeros of several lengths (shorter and longer than a frame), at 25 and 30 fps.
#[test]
fn streamed_and_whole_audio_get_the_same_digital_silence_decisions() {
    use cadence::frame_loop::audio::Vad;
    let dir = tempfile::tempdir().unwrap();
    let wav = dir.path().join("digital.wav");
    let spec = hound::WavSpec {
        channels: 1,
        sample_rate: 16_000,
        bits_per_sample: 16,
        sample_format: hound::SampleFormat::Int,
    };
    let mut w = hound::WavWriter::create(&wav, spec).unwrap();
    // (tone samples, zero samples) in turn.
    for (tone, zeros) in [(3000, 200), (1000, 700), (500, 5000), (2000, 1300), (640, 9000)] {
        for i in 0..tone {
            w.write_sample((3000.0 * (i as f32 * 0.2).sin()) as i16 + 1).unwrap();
        }
        for _ in 0..zeros {
            w.write_sample(0i16).unwrap();
        }
    }
    w.finalize().unwrap();
    let whole: ClipAudio = cadence::frame_loop::audio::load_audio(&wav, 600.0).unwrap().into();
    let streamed: ClipAudio = StreamedAudio::open(&wav, 600.0, &Vad::Digital).unwrap().into();
    let samples = cadence_media::load_wav(&wav).unwrap().samples_16k;
    for fps in [25.0, 30.0] {
        let n = whole.video_frames(fps);
        let a = whole.voice_activity(fps, n, &Vad::Digital).unwrap();
        assert_eq!(a, streamed.voice_activity(fps, n, &Vad::Digital).unwrap(), "{fps} fps");
        assert_eq!(a, cadence_media::vad::digital::voice_activity(&samples, fps, n), "{fps} fps");
        assert!(a.iter().any(|&s| s) && a.iter().any(|&s| !s), "{fps} fps: speech and silence");
    }
}
