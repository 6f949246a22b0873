//! Text to speech with libespeak-ng, and the phoneme events it reports: the speech a
//! `--text` render speaks, and its alignment.
//!
//! The library is loaded at run time (`libloading`), so cadence builds and runs without it; only
//! speaking text needs it, and without it the error names the Debian package
//! ([`PACKAGE`]). The API used (speak_lib.h, espeak-ng 1.49 and later): `espeak_Initialize` in
//! synchronous mode with phoneme events reported as IPA, `espeak_SetVoiceByName`,
//! `espeak_SetParameter(espeakRATE)`, `espeak_SetSynthCallback`, `espeak_Synth` and
//! `espeak_Synchronize`. The callback receives the 16-bit mono samples and the events;
//! each `espeakEVENT_PHONEME` carries the phoneme's IPA name and its time in the output
//! (`audio_position`, ms). A phoneme lasts until the next phoneme event (or the end of the
//! audio); the gaps espeak-ng leaves between clauses are silence.
//!
//! libespeak-ng keeps global state and is not re-entrant: one synthesis at a time (a process-wide
//! lock), initialised once per process.

use super::alignment::{Alignment, Phone};
use anyhow::{bail, ensure, Context, Result};
use std::ffi::{c_char, c_int, c_uint, c_void, CString};
use std::sync::Mutex;

/// The shared object loaded, and the Debian package that has it.
pub const LIBRARY: &str = "libespeak-ng.so.1";
pub const PACKAGE: &str = "libespeak-ng1";
/// Environment variable naming another path to load instead of [`LIBRARY`] (a library outside
/// the loader's search path).
pub const LIBRARY_ENV: &str = "CADENCE_ESPEAK_LIBRARY";

/// The default voice and speaking rate (words per minute; espeak-ng's default is 175).
pub const DEFAULT_VOICE: &str = "en-us";
pub const DEFAULT_RATE_WPM: u32 = 150;

/// Speech and its alignment.
#[derive(Clone, Debug)]
pub struct Speech {
    pub sample_rate: u32,
    /// 16-bit mono samples.
    pub samples: Vec<i16>,
    pub alignment: Alignment,
    /// The library's version string (`espeak_Info`).
    pub version: String,
}

impl Speech {
    pub fn duration_s(&self) -> f64 {
        self.samples.len() as f64 / self.sample_rate as f64
    }

    /// Writes the samples as a 16-bit mono WAV.
    pub fn write_wav(&self, path: &std::path::Path) -> Result<()> {
        let spec = hound::WavSpec {
            channels: 1,
            sample_rate: self.sample_rate,
            bits_per_sample: 16,
            sample_format: hound::SampleFormat::Int,
        };
        let mut w = hound::WavWriter::create(path, spec).with_context(|| format!("creating {}", path.display()))?;
        for &s in &self.samples {
            w.write_sample(s)?;
        }
        w.finalize().with_context(|| format!("writing {}", path.display()))?;
        Ok(())
    }
}

// speak_lib.h
const AUDIO_OUTPUT_SYNCHRONOUS: c_int = 2;
const INITIALIZE_PHONEME_EVENTS: c_int = 0x0001;
const INITIALIZE_PHONEME_IPA: c_int = 0x0002;
const POS_CHARACTER: c_int = 1;
const CHARS_UTF8: c_uint = 1;
const SSML: c_uint = 0x10;
const ESPEAK_RATE: c_int = 1;
const EVENT_LIST_TERMINATED: c_int = 0;
const EVENT_PHONEME: c_int = 7;
const EE_OK: c_int = 0;

#[repr(C)]
#[derive(Clone, Copy)]
struct Event {
    kind: c_int,
    unique_identifier: c_uint,
    text_position: c_int,
    length: c_int,
    audio_position: c_int,
    sample: c_int,
    user_data: *mut c_void,
    /// union { int number; const char *name; char string[8]; }
    id: [u8; 8],
}

type SynthCallback = unsafe extern "C" fn(*mut i16, c_int, *mut Event) -> c_int;

struct Api {
    _lib: libloading::Library,
    initialize: unsafe extern "C" fn(c_int, c_int, *const c_char, c_int) -> c_int,
    set_callback: unsafe extern "C" fn(SynthCallback),
    set_voice: unsafe extern "C" fn(*const c_char) -> c_int,
    set_parameter: unsafe extern "C" fn(c_int, c_int, c_int) -> c_int,
    #[allow(clippy::type_complexity)]
    synth: unsafe extern "C" fn(*const c_void, usize, c_uint, c_int, c_uint, c_uint, *mut c_uint, *mut c_void) -> c_int,
    synchronize: unsafe extern "C" fn() -> c_int,
    info: unsafe extern "C" fn(*mut *const c_char) -> *const c_char,
    sample_rate: u32,
}

// The function pointers point into the library, which lives as long as `Api` (`_lib`).
unsafe impl Send for Api {}

/// The loaded library (once per process) and the lock that serialises its use.
static API: Mutex<Option<Api>> = Mutex::new(None);

/// What the callback collects during one synthesis.
#[derive(Default)]
struct Collected {
    samples: Vec<i16>,
    phonemes: Vec<(i64, String)>,
}

static COLLECTED: Mutex<Option<Collected>> = Mutex::new(None);

unsafe extern "C" fn on_synth(wav: *mut i16, n: c_int, events: *mut Event) -> c_int {
    // No panic may cross into C: a poisoned lock or anything else aborts the synthesis instead.
    let ok = std::panic::catch_unwind(|| {
        let mut guard = COLLECTED.lock().ok()?;
        let c = guard.as_mut()?;
        if !wav.is_null() && n > 0 {
            // SAFETY: espeak-ng hands `n` samples at `wav`, valid for this call.
            c.samples.extend_from_slice(unsafe { std::slice::from_raw_parts(wav, n as usize) });
        }
        let mut e = events;
        while !e.is_null() {
            // SAFETY: the event list is terminated by an espeakEVENT_LIST_TERMINATED entry.
            let ev = unsafe { *e };
            if ev.kind == EVENT_LIST_TERMINATED {
                break;
            }
            if ev.kind == EVENT_PHONEME {
                let len = ev.id.iter().position(|&b| b == 0).unwrap_or(8);
                let name = String::from_utf8_lossy(&ev.id[..len]).into_owned();
                c.phonemes.push((ev.audio_position as i64, name));
            }
            e = unsafe { e.add(1) };
        }
        Some(())
    });
    match ok {
        Ok(Some(())) => 0,
        _ => 1, // non-zero: stop synthesis
    }
}

fn load() -> Result<Api> {
    // SAFETY: loading a shared library runs its initialisers; libespeak-ng's are plain C.
    let path = std::env::var_os(LIBRARY_ENV).unwrap_or_else(|| LIBRARY.into());
    let lib = unsafe { libloading::Library::new(&path) }.map_err(|e| {
        anyhow::anyhow!(
            "speaking text needs libespeak-ng, which could not be loaded ({e}); install the Debian package {PACKAGE} (apt-get install {PACKAGE})"
        )
    })?;
    macro_rules! sym {
        ($name:literal) => {
            // SAFETY: the signature is the one speak_lib.h declares for this symbol.
            *unsafe { lib.get(concat!($name, "\0").as_bytes()) }.map_err(|e| {
                anyhow::anyhow!("{} has no {} ({e}): not an espeak-ng library", path.to_string_lossy(), $name)
            })?
        };
    }
    let mut api = Api {
        initialize: sym!("espeak_Initialize"),
        set_callback: sym!("espeak_SetSynthCallback"),
        set_voice: sym!("espeak_SetVoiceByName"),
        set_parameter: sym!("espeak_SetParameter"),
        synth: sym!("espeak_Synth"),
        synchronize: sym!("espeak_Synchronize"),
        info: sym!("espeak_Info"),
        sample_rate: 0,
        _lib: lib,
    };
    // SAFETY: documented call; NULL path = the default espeak-ng-data location.
    let rate = unsafe {
        (api.initialize)(
            AUDIO_OUTPUT_SYNCHRONOUS,
            0,
            std::ptr::null(),
            INITIALIZE_PHONEME_EVENTS | INITIALIZE_PHONEME_IPA,
        )
    };
    ensure!(
        rate > 0,
        "espeak_Initialize failed (returned {rate}): is the espeak-ng-data of package {PACKAGE} installed?"
    );
    api.sample_rate = rate as u32;
    // SAFETY: `on_synth` has the callback signature speak_lib.h declares.
    unsafe { (api.set_callback)(on_synth) };
    Ok(api)
}

/// Whether libespeak-ng can be loaded here.
pub fn available() -> bool {
    with_api(|_| Ok(())).is_ok()
}

fn with_api<T>(f: impl FnOnce(&Api) -> Result<T>) -> Result<T> {
    let mut guard = API.lock().map_err(|_| anyhow::anyhow!("the espeak-ng lock is poisoned"))?;
    if guard.is_none() {
        *guard = Some(load()?);
    }
    f(guard.as_ref().expect("loaded above"))
}

/// Speaks `text` with `voice` at `rate_wpm` and returns the samples and the phoneme alignment.
/// Text that starts with `<speak` is SSML (e.g. `<break time="1500ms"/>` for a pause).
pub fn speak(text: &str, voice: &str, rate_wpm: u32) -> Result<Speech> {
    ensure!(!text.trim().is_empty(), "the text to speak is empty");
    ensure!((80..=450).contains(&rate_wpm), "speaking rate {rate_wpm} words/min is outside espeak-ng's 80..450");
    let c_text = CString::new(text).map_err(|_| anyhow::anyhow!("the text contains a NUL character"))?;
    let c_voice = CString::new(voice).map_err(|_| anyhow::anyhow!("the voice name contains a NUL character"))?;
    with_api(|api| {
        // SAFETY: documented calls with valid NUL-terminated strings; synchronous mode returns
        // after the callback has seen all audio.
        unsafe {
            let r = (api.set_voice)(c_voice.as_ptr());
            ensure!(r == EE_OK, "espeak-ng has no voice '{voice}' (espeak_SetVoiceByName returned {r})");
            let r = (api.set_parameter)(ESPEAK_RATE, rate_wpm as c_int, 0);
            ensure!(r == EE_OK, "espeak_SetParameter(rate) returned {r}");
        }
        *COLLECTED.lock().map_err(|_| anyhow::anyhow!("the espeak-ng lock is poisoned"))? = Some(Collected::default());
        let r = unsafe {
            (api.synth)(
                c_text.as_ptr() as *const c_void,
                c_text.as_bytes_with_nul().len(),
                0,
                POS_CHARACTER,
                0,
                if text.trim_start().starts_with("<speak") { CHARS_UTF8 | SSML } else { CHARS_UTF8 },
                std::ptr::null_mut(),
                std::ptr::null_mut(),
            )
        };
        let sync = unsafe { (api.synchronize)() };
        let collected = COLLECTED.lock().map_err(|_| anyhow::anyhow!("the espeak-ng lock is poisoned"))?.take();
        ensure!(r == EE_OK && sync == EE_OK, "espeak_Synth failed (returned {r}, synchronize {sync})");
        let c = collected.context("espeak-ng produced nothing")?;
        ensure!(!c.samples.is_empty(), "espeak-ng produced no audio for the text");
        let version = unsafe {
            let p = (api.info)(std::ptr::null_mut());
            if p.is_null() {
                "unknown".to_string()
            } else {
                std::ffi::CStr::from_ptr(p).to_string_lossy().into_owned()
            }
        };
        let duration = c.samples.len() as f64 / api.sample_rate as f64;
        let alignment = phoneme_intervals(&c.phonemes, duration)?;
        Ok(Speech { sample_rate: api.sample_rate, samples: c.samples, alignment, version })
    })
}

/// Intervals from phoneme start events (ms, name): each lasts until the next event, the last
/// until the end of the audio. Events at the same time keep the last one (espeak-ng reports a
/// zero-length event for some stress and boundary symbols).
pub fn phoneme_intervals(events: &[(i64, String)], duration_s: f64) -> Result<Alignment> {
    let mut starts: Vec<(f64, String)> = Vec::new();
    for (ms, name) in events {
        let t = *ms as f64 / 1000.0;
        ensure!(t >= 0.0, "espeak-ng reported a phoneme at a negative time ({ms} ms)");
        if let Some(last) = starts.last_mut() {
            ensure!(t >= last.0, "espeak-ng reported phonemes out of order ({ms} ms after {} s)", last.0);
            if t == last.0 {
                *last = (t, name.clone());
                continue;
            }
        }
        starts.push((t, name.clone()));
    }
    // espeak-ng rounds event times down to the millisecond: an event at the very end of the
    // audio (a final pause) starts nothing; one later than that is an error.
    if let Some(&(t, _)) = starts.iter().find(|(t, _)| *t > duration_s + 1e-3) {
        bail!("espeak-ng reported a phoneme at {t} s, past the end of its audio ({duration_s} s)");
    }
    starts.retain(|(t, _)| *t < duration_s);
    let mut phones = Vec::with_capacity(starts.len());
    for (i, (t, name)) in starts.iter().enumerate() {
        let end = starts.get(i + 1).map_or(duration_s, |n| n.0);
        phones.push(Phone { start: *t, end, phoneme: name.clone() });
    }
    Alignment::new(phones)
}
