//! Writes the seed corpus of every fuzz target into `fuzz/corpus/<target>/`: small valid inputs
//! of each format and variant cadence accepts. Run it again after a format change and commit
//! the files: `cargo run --release -p cadence-fuzz --bin make_corpus`.

use anyhow::Result;
use cadence_media::{Audio, EncoderKind, FrameRate, RgbImage, VideoWriter};
use std::path::Path;

fn main() -> Result<()> {
    let root = Path::new(env!("CARGO_MANIFEST_DIR")).join("corpus");
    let dir = |t: &str| -> Result<std::path::PathBuf> {
        let d = root.join(t);
        std::fs::create_dir_all(&d)?;
        Ok(d)
    };

    let npy = dir("npy")?;
    cadence::npy::save(&npy.join("f32_4x8.npy"), &[4, 8], &(0..32).map(|i| i as f32 * 0.25).collect::<Vec<_>>())?;
    let h: Vec<half::f16> = (0..12).map(|i| half::f16::from_f32(i as f32 - 6.0)).collect();
    cadence::npy::save(&npy.join("f16_2x3x2.npy"), &[2, 3, 2], &h)?;
    cadence::npy::save(&npy.join("f32_scalar.npy"), &[], &[1.5f32])?;

    let wav = dir("wav")?;
    let write = |name: &str, rate: u32, ch: u16, bits: u16, float: bool| -> Result<()> {
        let spec = hound::WavSpec {
            channels: ch,
            sample_rate: rate,
            bits_per_sample: bits,
            sample_format: if float { hound::SampleFormat::Float } else { hound::SampleFormat::Int },
        };
        let mut w = hound::WavWriter::create(wav.join(name), spec)?;
        for i in 0..64 * ch as i32 {
            let v = ((i as f32) * 0.3).sin() * 0.5;
            if float {
                w.write_sample(v)?;
            } else {
                w.write_sample((v * ((1i64 << (bits - 1)) - 1) as f32) as i32)?;
            }
        }
        w.finalize()?;
        Ok(())
    };
    write("pcm16_mono_8k.wav", 8_000, 1, 16, false)?;
    write("pcm24_stereo_44k1.wav", 44_100, 2, 24, false)?;
    write("pcm8_mono_16k.wav", 16_000, 1, 8, false)?;
    write("float32_mono_22k05.wav", 22_050, 1, 32, true)?;
    // A pipe-written WAV: placeholder sizes (what ffmpeg writes to a pipe).
    let mut b = std::fs::read(wav.join("pcm16_mono_8k.wav"))?;
    let data = b.windows(4).position(|w| w == b"data").expect("data chunk");
    b[4..8].copy_from_slice(&u32::MAX.to_le_bytes());
    b[data + 4..data + 8].copy_from_slice(&u32::MAX.to_le_bytes());
    std::fs::write(wav.join("pipe_placeholder.wav"), b)?;

    let image = dir("image")?;
    let img = RgbImage::from_fn(64, 64, |x, y| image::Rgb([(x * 4) as u8, (y * 4) as u8, 128]));
    img.save(image.join("rgb_64.png"))?;
    img.save(image.join("rgb_64.jpg"))?;
    image::GrayImage::from_fn(64, 80, |x, y| image::Luma([(x ^ y) as u8])).save(image.join("gray_64x80.png"))?;

    let mp4 = dir("mp4")?;
    let frame = |t: usize| -> Vec<u8> { (0..64 * 64 * 3 / 2).map(|i| ((i + 3 * t) % 200 + 16) as u8).collect() };
    let audio = Audio::from_samples_16k((0..3200).map(|i| (i as f32 * 0.05).sin() * 0.3).collect());
    for (name, a) in [("h264_aac.mp4", Some(&audio)), ("h264_only.mp4", None)] {
        let mut w = VideoWriter::create(mp4.join(name), 64, 64, FrameRate::whole(25), EncoderKind::OpenH264, a)?;
        for t in 0..5 {
            w.push_nv12(&frame(t))?;
        }
        w.finish()?;
    }
    for t in ["npy", "wav", "image", "mp4"] {
        let d = root.join(t);
        let n = std::fs::read_dir(&d)?.count();
        let bytes: u64 = std::fs::read_dir(&d)?.flatten().map(|e| e.metadata().map(|m| m.len()).unwrap_or(0)).sum();
        println!("{}: {n} files, {bytes} bytes", d.display());
    }
    Ok(())
}
