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
    cadence::io::npy::save(&npy.join("f32_4x8.npy"), &[4, 8], &(0..32).map(|i| i as f32 * 0.25).collect::<Vec<_>>())?;
    let h: Vec<half::f16> = (0..12).map(|i| half::f16::from_f32(i as f32 - 6.0)).collect();
    cadence::io::npy::save(&npy.join("f16_2x3x2.npy"), &[2, 3, 2], &h)?;
    cadence::io::npy::save(&npy.join("f32_scalar.npy"), &[], &[1.5f32])?;

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
    // Phoneme alignments: Praat's long and short TextGrid text formats (a words tier beside the
    // phones tier, a quoted quote, a comment), UTF-16 as older Praat writes it, and the JSON list.
    let alignment = dir("alignment")?;
    let phones = [(0.0, 0.1, ""), (0.1, 0.18, "B"), (0.18, 0.4, "AA1"), (0.4, 0.5, "P"), (0.5, 0.6, "sil")];
    let mut long = String::from(
        "File type = \"ooTextFile\"\nObject class = \"TextGrid\"\n\nxmin = 0\nxmax = 0.6\ntiers? <exists>\nsize = 2\nitem []:\n",
    );
    long += "    item [1]:\n        class = \"IntervalTier\"\n        name = \"words\"\n        xmin = 0\n        xmax = 0.6\n        intervals: size = 1\n        intervals [1]:\n            xmin = 0\n            xmax = 0.6\n            text = \"bob \"\"the\"\" pa\"\n";
    long += &format!("    item [2]:\n        class = \"IntervalTier\"\n        name = \"phones\"\n        xmin = 0\n        xmax = 0.6\n        intervals: size = {}\n", phones.len());
    let mut short = format!(
        "File type = \"ooTextFile\"\nObject class = \"TextGrid\"\n\n0\n0.6\n<exists>\n1\n\"IntervalTier\"\n\"phones\" ! the phone tier\n0\n0.6\n{}\n",
        phones.len()
    );
    let mut json = Vec::new();
    for (i, (a, b, p)) in phones.iter().enumerate() {
        long += &format!(
            "        intervals [{}]:\n            xmin = {a}\n            xmax = {b}\n            text = \"{p}\"\n",
            i + 1
        );
        short += &format!("{a}\n{b}\n\"{p}\"\n");
        json.push(format!("{{\"start\": {a}, \"end\": {b}, \"phoneme\": \"{p}\"}}"));
    }
    std::fs::write(alignment.join("long.TextGrid"), &long)?;
    std::fs::write(alignment.join("short.TextGrid"), &short)?;
    let utf16: Vec<u8> = [0xfeu8, 0xff].into_iter().chain(short.encode_utf16().flat_map(u16::to_be_bytes)).collect();
    std::fs::write(alignment.join("short_utf16be.TextGrid"), utf16)?;
    std::fs::write(alignment.join("list.json"), format!("[{}]", json.join(", ")))?;

    for t in ["npy", "wav", "image", "mp4", "alignment"] {
        let d = root.join(t);
        let n = std::fs::read_dir(&d)?.count();
        let bytes: u64 = std::fs::read_dir(&d)?.flatten().map(|e| e.metadata().map(|m| m.len()).unwrap_or(0)).sum();
        println!("{}: {n} files, {bytes} bytes", d.display());
    }
    Ok(())
}
