mod common;

use cadence_media::audio::resampled_len;
use cadence_media::{load_wav, wav_duration, MediaError};
use common::*;

/// Dominant frequency by counting zero crossings (the signals are pure sines).
fn zero_crossing_freq(x: &[f32], rate: f32) -> f32 {
    let n = x.windows(2).filter(|w| (w[0] < 0.0) != (w[1] < 0.0)).count();
    n as f32 / 2.0 / (x.len() as f32 / rate)
}

fn check_variant(rate: u32, channels: u16, bits: u16, float: bool, secs: f64) {
    let dir = tmp_dir(&format!("wav-{rate}-{channels}-{bits}-{float}"));
    let path = dir.join("a.wav");
    let n = (rate as f64 * secs).round() as usize;
    // Left: 440 Hz at 0.5; other channels silent, so the mono downmix has amplitude 0.5/channels.
    let s = sine(440.0, rate, 0.5);
    write_wav(&path, rate, channels, bits, float, n, |i, c| if c == 0 { s(i, c) } else { 0.0 });
    let d = wav_duration(&path).unwrap();
    assert!((d - n as f64 / rate as f64).abs() < 1e-9, "header duration {d}");
    let a = load_wav(&path).unwrap();
    assert_eq!(a.source_rate, rate);
    assert_eq!(a.source_channels, channels);
    assert!((a.duration_s - secs).abs() < 1e-3);
    assert_eq!(a.samples_16k.len(), resampled_len(n, rate, 16_000));
    assert!(
        (a.samples_16k.len() as f64 - secs * 16_000.0).abs() <= 1.0,
        "{} samples for {secs} s",
        a.samples_16k.len()
    );
    // Level and pitch survive resampling (edges excluded: filter transients).
    let mid = &a.samples_16k[800..a.samples_16k.len() - 800];
    let want_rms = 0.5 / channels as f32 / 2f32.sqrt();
    let got = rms(mid);
    assert!((got - want_rms).abs() / want_rms < 0.03, "rms {got} vs {want_rms}");
    let f = zero_crossing_freq(mid, 16_000.0);
    assert!((f - 440.0).abs() < 3.0, "frequency {f}");
    // The mux track keeps the source channels and an AAC rate.
    assert_eq!(a.track.channels, if channels <= 2 { channels } else { 1 });
    assert!(cadence_media::audio::AAC_RATES.contains(&a.track.sample_rate));
    assert!(a.track.sample_rate <= 48_000);
    let track_secs = a.track.frames() as f64 / a.track.sample_rate as f64;
    assert!((track_secs - secs).abs() < 1e-3, "track {track_secs} s");
}

#[test]
fn wav_8k_mono_16bit() {
    check_variant(8_000, 1, 16, false, 1.0);
}

#[test]
fn wav_44k1_stereo_16bit() {
    check_variant(44_100, 2, 16, false, 1.5);
}

#[test]
fn wav_48k_mono_24bit() {
    check_variant(48_000, 1, 24, false, 0.75);
}

#[test]
fn wav_22k05_float() {
    check_variant(22_050, 1, 32, true, 2.0);
}

#[test]
fn wav_96k_three_channels_goes_to_48k_mono_track() {
    check_variant(96_000, 3, 16, false, 0.5);
    let dir = tmp_dir("wav96");
    let path = dir.join("a.wav");
    write_wav(&path, 96_000, 3, 16, false, 9600, sine(440.0, 96_000, 0.5));
    let a = load_wav(&path).unwrap();
    assert_eq!((a.track.sample_rate, a.track.channels), (48_000, 1));
}

#[test]
fn wav_16k_passes_through_unchanged() {
    let dir = tmp_dir("wav16");
    let path = dir.join("a.wav");
    write_wav(&path, 16_000, 1, 32, true, 1000, |i, _| (i as f32 / 1000.0) - 0.5);
    let a = load_wav(&path).unwrap();
    for (i, s) in a.samples_16k.iter().enumerate() {
        assert_eq!(*s, (i as f32 / 1000.0) - 0.5);
    }
}

fn assert_one_line(e: &MediaError, path: &std::path::Path) -> String {
    let m = e.to_string();
    assert!(!m.contains('\n'), "multi-line message: {m}");
    assert!(m.contains(&path.display().to_string()), "message lacks the path: {m}");
    m
}

#[test]
fn text_file_is_not_a_wav() {
    let dir = tmp_dir("badtext");
    let p = dir.join("speech.wav");
    std::fs::write(&p, "this is not audio at all, just some text\n").unwrap();
    let e = load_wav(&p).unwrap_err();
    assert!(matches!(e, MediaError::NotWav { .. }), "{e:?}");
    assert!(assert_one_line(&e, &p).contains("not a WAV"));
    assert!(matches!(wav_duration(&p).unwrap_err(), MediaError::NotWav { .. }));
    let empty = dir.join("empty.wav");
    std::fs::write(&empty, b"").unwrap();
    assert!(matches!(load_wav(&empty).unwrap_err(), MediaError::NotWav { .. }));
}

#[test]
fn png_is_not_a_wav() {
    let dir = tmp_dir("badpng");
    let p = dir.join("x.wav");
    image::RgbImage::new(8, 8).save_with_format(&p, image::ImageFormat::Png).unwrap();
    assert!(matches!(load_wav(&p).unwrap_err(), MediaError::NotWav { .. }));
}

#[test]
fn truncated_header_and_data() {
    let dir = tmp_dir("trunc");
    let good = dir.join("good.wav");
    write_wav(&good, 16_000, 1, 16, false, 16_000, sine(300.0, 16_000, 0.3));
    let bytes = std::fs::read(&good).unwrap();

    let head = dir.join("head.wav");
    std::fs::write(&head, &bytes[..24]).unwrap();
    let e = load_wav(&head).unwrap_err();
    assert!(matches!(e, MediaError::TruncatedWav { .. }), "{e:?}");
    assert!(assert_one_line(&e, &head).contains("truncated"));

    let half = dir.join("half.wav");
    std::fs::write(&half, &bytes[..bytes.len() / 2]).unwrap();
    let e = load_wav(&half).unwrap_err();
    assert!(matches!(e, MediaError::TruncatedWav { .. }), "{e:?}");
    assert_one_line(&e, &half);
}

#[test]
fn zero_samples_is_an_error() {
    let dir = tmp_dir("zero");
    let p = dir.join("zero.wav");
    write_wav(&p, 16_000, 1, 16, false, 0, |_, _| 0.0);
    let e = load_wav(&p).unwrap_err();
    assert!(matches!(e, MediaError::EmptyAudio { .. }), "{e:?}");
    assert!(assert_one_line(&e, &p).contains("zero-length"));
    assert_eq!(wav_duration(&p).unwrap(), 0.0);
}

#[test]
fn missing_file_is_an_io_error() {
    let p = std::path::Path::new("/nonexistent/dir/speech.wav");
    let e = load_wav(p).unwrap_err();
    assert!(matches!(e, MediaError::Io { .. }), "{e:?}");
}

/// WAVs written to a pipe carry a placeholder data size (espeak-ng --stdout: 0x7FFFF000, ffmpeg:
/// 0xFFFFFFFF): the samples run to the end of the file, and the duration is what is there.
#[test]
fn pipe_written_wavs_with_placeholder_sizes() {
    let dir = tmp_dir("pipe");
    let good = dir.join("good.wav");
    write_wav(&good, 22_050, 1, 16, false, 22_050, sine(300.0, 22_050, 0.3));
    let reference = load_wav(&good).unwrap();
    let bytes = std::fs::read(&good).unwrap();
    let data = bytes.windows(4).position(|w| w == b"data").unwrap();
    for placeholder in [0x7FFF_F000u32, 0xFFFF_FFFF] {
        let mut b = bytes.clone();
        b[4..8].copy_from_slice(&placeholder.to_le_bytes());
        b[data + 4..data + 8].copy_from_slice(&placeholder.to_le_bytes());
        let p = dir.join(format!("pipe-{placeholder:x}.wav"));
        std::fs::write(&p, &b).unwrap();
        assert!((wav_duration(&p).unwrap() - 1.0).abs() < 1e-9, "{placeholder:x}");
        assert_eq!(load_wav(&p).unwrap(), reference);
    }
}

/// A float WAV holding NaN or infinity is refused with the time of the first bad sample
/// (rendering it would silently turn into silence).
#[test]
fn non_finite_float_samples_are_refused() {
    let dir = tmp_dir("nan");
    for (name, bad) in [("nan", f32::NAN), ("inf", f32::NEG_INFINITY)] {
        let p = dir.join(format!("{name}.wav"));
        write_wav(&p, 16_000, 2, 32, true, 32_000, |i, c| if i == 24_000 && c == 1 { bad } else { 0.1 });
        let e = load_wav(&p).unwrap_err();
        let m = assert_one_line(&e, &p);
        assert!(m.contains("sample frame 24000 (1.500 s) is not a finite number"), "{m}");
    }
}

/// Piece sizes that cut a signal at awkward places: single samples, less than the resampler's
/// 1024-sample chunk, more than one chunk, and empty pieces.
const PIECES: [usize; 7] = [1, 0, 333, 1024, 5000, 7, 2047];

/// The resampler fed in pieces gives the whole signal's output, sample for sample (the chunked
/// resampler is the definition: [`resample`] is one piece), for down- and upsampling.
#[test]
fn stream_resampler_in_pieces_equals_the_whole_signal() {
    use cadence_media::audio::resample;
    use cadence_media::StreamResampler;
    for (from, to) in [(44_100, 16_000), (48_000, 16_000), (22_050, 16_000), (16_000, 48_000), (16_000, 16_000)] {
        let n = from as usize * 3 / 2 + 17;
        let x: Vec<f32> =
            (0..n).map(|i| 0.4 * (i as f32 * 0.031).sin() + 0.2 * ((i * 7919) % 13) as f32 / 13.0).collect();
        let whole = resample(&x, from, to).unwrap();
        assert_eq!(whole.len(), resampled_len(n, from, to));
        let mut rs = StreamResampler::new(from, to).unwrap();
        let (mut out, mut at) = (Vec::new(), 0);
        for len in PIECES.iter().cycle() {
            if at >= n {
                break;
            }
            let end = (at + len).min(n);
            rs.push(&x[at..end], &mut out).unwrap();
            assert!(out.len() <= resampled_len(end, from, to), "{from}->{to}: output ahead of its input");
            at = end;
        }
        rs.finish(&mut out).unwrap();
        assert!(out == whole, "{from}->{to}: the resampler fed in pieces differs from the whole signal's");
    }
}

/// A WAV read as a stream, in pieces, decodes to what `load_wav` makes of the whole file: the
/// 16 kHz analysis signal and the track, for a resampled stereo file and a 3-channel one.
#[test]
fn audio_stream_in_pieces_equals_load_wav() {
    let dir = tmp_dir("audio-stream");
    for (rate, channels) in [(44_100u32, 2u16), (96_000, 3), (16_000, 1)] {
        let path = dir.join(format!("s{rate}-{channels}.wav"));
        let n = rate as usize * 2 + 123;
        write_wav(&path, rate, channels, 16, false, n, |i, c| {
            0.3 * (i as f32 * (0.01 + 0.003 * c as f32)).sin() * ((i / 3000) % 2) as f32
        });
        let whole = load_wav(&path).unwrap();
        let mut stream = cadence_media::open_wav_stream(&path).unwrap();
        assert_eq!(stream.track_format(), whole.track.format());
        let (mut mono, mut track) = (Vec::new(), Vec::new());
        let mut more = true;
        for len in PIECES.iter().cycle() {
            if !more {
                break;
            }
            more = stream.read(*len, &mut mono, &mut track).unwrap();
        }
        assert!(!stream.read(100, &mut mono, &mut track).unwrap(), "a finished stream stays finished");
        assert!(mono == whole.samples_16k, "{rate} Hz x {channels}: the streamed 16 kHz signal differs");
        assert!(track == whole.track.samples, "{rate} Hz x {channels}: the streamed track differs");
    }
    // A stream (here with no known length, as a pipe) cut inside a sample frame is an error
    // naming the source when the reading gets there; a file cut so is refused when opened.
    let path = dir.join("s44100-2.wav");
    let bytes = std::fs::read(&path).unwrap();
    let cut = &bytes[..bytes.len() - 3];
    let reader = cadence_media::wav::WavReader::new(std::io::Cursor::new(cut.to_vec()), None).unwrap();
    let mut stream = cadence_media::AudioStream::new(reader, "cut.wav").unwrap();
    let (mut mono, mut track) = (Vec::new(), Vec::new());
    let err = loop {
        match stream.read(4096, &mut mono, &mut track) {
            Ok(true) => continue,
            Ok(false) => panic!("a truncated stream ended cleanly"),
            Err(e) => break e,
        }
    };
    let msg = err.to_string();
    assert!(msg.contains("cut.wav") && msg.contains("truncated"), "{msg}");
    let file = dir.join("cut.wav");
    std::fs::write(&file, cut).unwrap();
    let msg = cadence_media::open_wav_stream(&file).err().expect("a cut file opened").to_string();
    assert!(msg.contains("cut.wav") && msg.contains("truncated"), "{msg}");
}
