//! VIDEO_DOC

use crate::frame_loop::audio::ClipAudio;
use crate::frame_loop::clock;
use crate::frame_loop::RenderStats;
use crate::io::output::OutputPath;
use anyhow::{Context, Result};
use cadence_media::{EncoderKind, FragmentedWriter, VideoStats, VideoWriter};
use std::io::Write;
use std::time::Instant;

/// Where the encoded frames go: an MP4 (a checked output, see [`crate::io::output`]), a fragmented
/// MP4 to a file (checked the same way) or to any writer (standard output, a socket), or nowhere
/// (timing the rest of the pipeline alone).
pub enum Output<'a> {
    Mp4 {
        out: &'a OutputPath,
        encoder: EncoderKind,
    },
    /// An init segment then one `moof`+`mdat` fragment per GOP, each written (and flushed) as
    /// soon as it is complete; `pace` holds every frame back to its time in the clip, counted
    /// from the first frame (a live feed).
    Fragmented {
        sink: Sink<'a>,
        encoder: EncoderKind,
        pace: bool,
    },
    Discard,
}

/// Where a fragmented MP4 goes.
pub enum Sink<'a> {
    /// A checked output file: written beside the target, renamed when complete.
    File(&'a OutputPath),
    /// Any writer (`name` names it in errors): what was written stays written, a failed render
    /// ends it after its last whole fragment.
    Writer { out: &'a mut dyn Write, name: &'a str },
}

pub struct RenderResult {
    pub stats: RenderStats,
    pub video: Option<VideoStats>,
    /// Milliseconds from the start of the render to the first frame handed to the encoder, and
    /// to the first fragment written (fragmented output only).
    pub first_frame_ms: Option<f64>,
    pub first_fragment_ms: Option<f64>,
    /// Paced output: frames that reached the encoder more than one frame period after their
    /// time (a live feed would have stalled there).
    pub late_frames: usize,
}

/// A frame loop as [`write_video`] runs it: it hands each NV12 frame to the sink in order and
/// reports progress in frames.
pub trait FrameLoop:
    FnMut(&mut dyn FnMut(usize, &[u8]) -> Result<()>, Box<dyn FnMut(usize) + '_>) -> Result<RenderStats>
{
}
impl<F> FrameLoop for F where
    F: FnMut(&mut dyn FnMut(usize, &[u8]) -> Result<()>, Box<dyn FnMut(usize) + '_>) -> Result<RenderStats>
{
}

/// Runs `frames` (any engine's frame loop, `size` pixels at `fps`) into `output` with `audio` as
/// the sound track: the one place where frames become an MP4 (checked output, encoder beside the
/// loop), a fragmented MP4 or nothing.
pub fn write_video(
    audio: &ClipAudio,
    size: (u32, u32),
    fps: cadence_media::FrameRate,
    output: Output,
    mut frames: impl FrameLoop,
    progress: impl FnMut(usize),
) -> Result<RenderResult> {
    let (w, h) = size;
    let t0 = Instant::now();
    let mut first_frame_ms = None;
    let mut go = |sink: &mut dyn FnMut(usize, &[u8]) -> Result<()>, progress: Box<dyn FnMut(usize) + '_>| {
        let mut timed = |i: usize, f: &[u8]| {
            first_frame_ms.get_or_insert_with(|| t0.elapsed().as_secs_f64() * 1e3);
            sink(i, f)
        };
        frames(&mut timed, progress)
    };
    let result =
        |stats, video| RenderResult { stats, video, first_frame_ms: None, first_fragment_ms: None, late_frames: 0 };
    match output {
        Output::Discard => {
            let stats = go(&mut |_, _| Ok(()), Box::new(progress))?;
            Ok(RenderResult { first_frame_ms, ..result(stats, None) })
        }
        Output::Mp4 { out, encoder } => {
            let partial = out.begin()?;
            let whole = audio.whole().context("a progressive MP4 needs the audio decoded whole")?;
            let writer = VideoWriter::create(partial.path(), w, h, fps, encoder, Some(whole))
                .map_err(|e| partial.user_error(e.into()))?;
            let queue = encoder_queue_frames(writer.frame_len());
            let (mut stats, beside) =
                encode_beside(writer, queue, EncoderPriority::Lowest, |sink| go(sink, Box::new(progress)))
                    .map_err(|e| partial.user_error(e))?;
            stats.times.encoder_ms += beside.flush_wait_ms;
            stats.times.total_ms += beside.flush_wait_ms;
            stats.times.encoder_busy_ms = beside.busy_ms;
            let video = beside.video;
            partial.commit()?;
            Ok(RenderResult { first_frame_ms, ..result(stats, Some(video)) })
        }
        Output::Fragmented { sink: Sink::File(out), encoder, pace } => {
            let partial = out.begin()?;
            let file = std::fs::File::create(partial.path())
                .map_err(|e| partial.user_error(anyhow::anyhow!("{}: cannot create: {e}", partial.path().display())))?;
            let name = out.path().display().to_string();
            let mut r =
                render_fragmented(go, audio, fps, w, h, encoder, pace, std::io::BufWriter::new(file), &name, progress)
                    .map_err(|e| partial.user_error(e))?;
            partial.commit()?;
            r.first_frame_ms = first_frame_ms;
            Ok(r)
        }
        Output::Fragmented { sink: Sink::Writer { out, name }, encoder, pace } => {
            let mut r = render_fragmented(go, audio, fps, w, h, encoder, pace, out, name, progress)?;
            r.first_frame_ms = first_frame_ms;
            Ok(r)
        }
    }
}

/// An encoder [`encode_beside`] runs on a thread of its own: it takes NV12 frames one at a time.
pub trait FrameEncoder: Send {
    /// What finishing returns.
    type Done: Send;
    fn push_nv12(&mut self, frame: &[u8]) -> Result<()>;
    fn finish(self) -> Result<Self::Done>;
}

impl FrameEncoder for VideoWriter {
    type Done = VideoStats;
    fn push_nv12(&mut self, frame: &[u8]) -> Result<()> {
        Ok(VideoWriter::push_nv12(self, frame)?)
    }
    fn finish(self) -> Result<VideoStats> {
        Ok(VideoWriter::finish(self)?)
    }
}

/// The scheduling priority of [`encode_beside`]'s encoder thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum EncoderPriority {
    /// The lowest (nice 19): the encoder takes a core only when the render's threads leave one
    /// idle. What renders use. Its queue holds about a window of frames
    /// ([`ENCODER_QUEUE_BYTES`]) and nothing waits for them before the end, so it loses nothing
    /// by yielding; at the render's priority it took its core from whichever stage was running
    /// when frames arrived, which is the decoder, the stage that hands them over (a 2-core
    /// render's decoder wall time grew by half with the encoder beside it, for the same CPU time).
    Lowest,
    /// The render's own: an encoder that contends with the stages (the stage clocks' tests).
    Render,
}

/// Lowers the calling thread's priority to nice 19 (Linux's nice is per thread). Raising a nice
/// value needs no privilege; a system that refuses it leaves the thread as it was.
fn run_below_the_render() {
    #[cfg(target_os = "linux")]
    // SAFETY: gettid and setpriority take no pointers; the id is this live thread's.
    unsafe {
        let tid = libc::gettid();
        libc::setpriority(libc::PRIO_PROCESS, tid as libc::id_t, 19);
    }
}

/// What [`encode_beside`] reports besides the frame loop's own result.
pub struct EncodedBeside<D> {
    /// What the encoder's `finish` returned.
    pub video: D,
    /// The encoder thread's own time (encoding and finishing), which overlapped the frame loop: its
    /// CPU time (on Linux; elsewhere the wall time of its calls).
    pub busy_ms: f64,
    /// How long the frame loop, once done, waited for the encoder to drain its queue and finish.
    pub flush_wait_ms: f64,
}

/// Bytes of frames waiting for the encoder thread at most: about one default render window (4 s
/// at 25 fps) of 1080x1920 NV12 frames (3.1 MB each). A windowed frame loop hands out a window's
/// frames in a burst after the window's keyframe work (with `--infill image` in little more time
/// than the compositing takes); a queue that holds them lets the encoder work through them while
/// the loop runs the next window's UNet. A queue of a few frames made the loop wait for the
/// encoder instead, for most of each window's frames.
pub const ENCODER_QUEUE_BYTES: usize = 320 << 20;

/// Frames the encoder's queue holds for frames of `frame_bytes` bytes: [`ENCODER_QUEUE_BYTES`]
/// of them, at least 4.
pub fn encoder_queue_frames(frame_bytes: usize) -> usize {
    (ENCODER_QUEUE_BYTES / frame_bytes.max(1)).max(4)
}

/// Runs the frame loop `frames` with a sink that hands each NV12 frame to `writer` on a thread of
/// its own. The encoders take one frame at a time on one thread (OpenH264 without slices), so run
/// inline they left the other cores idle for each frame's encode; beside the loop they overlap the
/// next frames' neural stages. At most `queue_frames` frames wait ([`encoder_queue_frames`]; the
/// loop blocks beyond that, and the sink's time, which the loop records as the encoder's, is then
/// the wait). An
/// encoder error ends the loop at its next frame and is the error returned.
/// The encoder's thread is not the render's: its CPU time stays out of the stages' CPU times
/// ([`crate::frame_loop::clock`]); `priority` is its scheduling priority.
pub fn encode_beside<T, E: FrameEncoder>(
    mut writer: E,
    queue_frames: usize,
    priority: EncoderPriority,
    frames: impl FnOnce(&mut dyn FnMut(usize, &[u8]) -> Result<()>) -> Result<T>,
) -> Result<(T, EncodedBeside<E::Done>)> {
    let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<u8>>(queue_frames.max(1));
    // Buffers come back for reuse, so the loop does not allocate a frame per frame.
    let (back_tx, back_rx) = std::sync::mpsc::channel::<Vec<u8>>();
    std::thread::scope(|scope| {
        let encoder = scope.spawn(move || -> Result<(E::Done, f64)> {
            // Not the render's: its CPU time stays out of the stages' (frame_loop::clock).
            let _foreign = clock::ForeignThread::register();
            if priority == EncoderPriority::Lowest {
                run_below_the_render();
            }
            let cpu0 = clock::this_thread_cpu_ms();
            let mut wall_ms = 0.0;
            for frame in rx {
                let t = Instant::now();
                writer.push_nv12(&frame)?;
                wall_ms += t.elapsed().as_secs_f64() * 1e3;
                let _ = back_tx.send(frame);
            }
            let t = Instant::now();
            let video = writer.finish()?;
            wall_ms += t.elapsed().as_secs_f64() * 1e3;
            // Its own work is its CPU time: at the lowest priority its wall time also holds the
            // time it waited for a core.
            let busy_ms = match (cpu0, clock::this_thread_cpu_ms()) {
                (Some(a), Some(b)) => b - a,
                _ => wall_ms,
            };
            Ok((video, busy_ms))
        });
        let looped = {
            let tx = tx; // dropped at the end of this block: the encoder's end of input
            frames(&mut |_, f: &[u8]| {
                let mut buf = back_rx.try_recv().unwrap_or_default();
                buf.clear();
                buf.extend_from_slice(f);
                tx.send(buf).map_err(|_| anyhow::anyhow!("the video encoder stopped"))
            })
        };
        let t = Instant::now();
        let encoded = encoder.join().map_err(|_| anyhow::anyhow!("the video encoder thread panicked"))?;
        let flush_wait_ms = t.elapsed().as_secs_f64() * 1e3;
        // The encoder's error first: a loop that stopped because the encoder did reports only
        // that the encoder stopped.
        let (video, busy_ms) = encoded.context("video encoder")?;
        Ok((looped?, EncodedBeside { video, busy_ms, flush_wait_ms }))
    })
}

/// The fragmented MP4 branch of [`render_clip`]: the clip's audio goes into the stream as the
/// frames reach it (each fragment carries the audio of its time span), and with `pace` each
/// frame waits for its time.
#[allow(clippy::too_many_arguments)]
fn render_fragmented<W: Write>(
    mut go: impl FrameLoop,
    clip: &ClipAudio,
    fps: cadence_media::FrameRate,
    w: u32,
    h: u32,
    encoder: EncoderKind,
    pace: bool,
    out: W,
    name: &str,
    progress: impl FnMut(usize),
) -> Result<RenderResult> {
    let t0 = Instant::now();
    let audio = clip.track_format();
    let mut writer = FragmentedWriter::new(out, name, w, h, fps, encoder, audio)?;
    let mut audio_sent = 0; // sample frames of the track already given to the writer
    let mut first_fragment_ms = None;
    let mut late_frames = 0;
    let mut started: Option<Instant> = None;
    let period = 1.0 / fps.hz();
    let mut stats = go(
        &mut |i, f| {
            if pace {
                let start = *started.get_or_insert_with(Instant::now);
                let due = start + std::time::Duration::from_secs_f64(i as f64 * period);
                let now = Instant::now();
                if now < due {
                    std::thread::sleep(due - now);
                } else if (now - due).as_secs_f64() > period {
                    late_frames += 1;
                }
            }
            // The audio up to the end of this frame, then the frame.
            if let Some(format) = audio {
                let upto =
                    (((i + 1) as f64 * period * format.sample_rate as f64).ceil() as usize).min(clip.track_frames());
                if upto > audio_sent {
                    clip.take_track(audio_sent, upto, &mut |s| Ok(writer.push_audio(s)?))?;
                    audio_sent = upto;
                }
            }
            writer.push_nv12(f)?;
            if first_fragment_ms.is_none() && writer.fragments_written() > 0 {
                first_fragment_ms = Some(t0.elapsed().as_secs_f64() * 1e3);
            }
            Ok(())
        },
        Box::new(progress),
    )?;
    let t = Instant::now();
    if audio.is_some() && audio_sent < clip.track_frames() {
        clip.take_track(audio_sent, clip.track_frames(), &mut |s| Ok(writer.push_audio(s)?))?;
    }
    let (video, mut out) = writer.finish()?;
    out.flush().map_err(|e| anyhow::anyhow!("{name}: {e}"))?;
    first_fragment_ms.get_or_insert_with(|| t0.elapsed().as_secs_f64() * 1e3);
    stats.times.encoder_ms += t.elapsed().as_secs_f64() * 1e3;
    stats.times.total_ms += t.elapsed().as_secs_f64() * 1e3;
    Ok(RenderResult { stats, video: Some(video), first_frame_ms: None, first_fragment_ms, late_frames })
}
