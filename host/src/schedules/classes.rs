//! Phoneme classes: what a phoneme does to the mouth, and so how often the UNet must see it.
//!
//! The table with every symbol is in `docs/adaptive_keyframes.md` (a test checks each symbol
//! listed there against [`classify`]); default strides: closure 1, release 2, open vowel 2,
//! other consonant 3, sustained vowel 4, silence 4.
//!
//! Closures are the bilabials and labiodentals: the lips close (or touch the teeth), a shape a
//! viewer notices when it is missed, so the source's "stride 1 on explosive bilabials". The
//! other plosives and affricates release a closure behind the lips: quick jaw and tongue
//! motion. Open vowels drop the jaw wide; the remaining vowels are held shapes ("stride 4 on
//! sustained vowels"). Other consonants (fricatives, nasals, liquids, glides) sit in between.
//! Silence inside speech (short pauses that the pipeline does not bypass) is held like a
//! sustained vowel. Symbols outside the table get [`DEFAULT_CLASS`], and the caller warns once,
//! listing them. MFA's `spn` (spoken noise: a word it could not transcribe) is speech of
//! unknown shape and gets the default class without a warning.
//!
//! Labels are normalised before the look-up: ARPAbet stress digits are dropped (except that AH0
//! is the schwa, a sustained vowel, while AH1/AH2 is the open ʌ), and IPA stress marks, length
//! marks, tie bars, joiners and diacritics (aspiration, palatalisation, nasalisation, ...) are
//! removed.

use std::fmt;

/// A phoneme class (see the module documentation for the table).
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum PhonemeClass {
    /// Bilabial and labiodental closures: p b m f v.
    Closure,
    /// Releases of the other plosives and affricates: t d k g tʃ dʒ.
    Release,
    /// Open vowels: a ɑ æ ɒ ɔ ʌ and the diphthongs starting open.
    OpenVowel,
    /// Other consonants: fricatives, nasals, liquids and glides.
    OtherConsonant,
    /// The other vowels: held shapes.
    SustainedVowel,
    /// Silence (pauses, unlabelled intervals).
    Silence,
}

/// The class of symbols the table does not know.
pub const DEFAULT_CLASS: PhonemeClass = PhonemeClass::OtherConsonant;

impl PhonemeClass {
    /// Every class, in priority order: where phonemes of several classes share one video frame,
    /// the frame takes the first (the one that needs keyframes most often).
    pub const ALL: [PhonemeClass; 6] = [
        PhonemeClass::Closure,
        PhonemeClass::Release,
        PhonemeClass::OpenVowel,
        PhonemeClass::OtherConsonant,
        PhonemeClass::SustainedVowel,
        PhonemeClass::Silence,
    ];

    pub fn name(self) -> &'static str {
        match self {
            PhonemeClass::Closure => "closure",
            PhonemeClass::Release => "release",
            PhonemeClass::OpenVowel => "open-vowel",
            PhonemeClass::OtherConsonant => "other-consonant",
            PhonemeClass::SustainedVowel => "sustained-vowel",
            PhonemeClass::Silence => "silence",
        }
    }

    pub fn parse(s: &str) -> Option<PhonemeClass> {
        PhonemeClass::ALL.into_iter().find(|c| c.name() == s)
    }

    /// Index in [`PhonemeClass::ALL`].
    pub fn index(self) -> usize {
        self as usize
    }
}

impl fmt::Display for PhonemeClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A keyframe stride per class (frames between keyframes inside phonemes of that class).
#[derive(Clone, Copy, Debug, PartialEq, serde::Serialize)]
pub struct ClassStrides(pub [f64; 6]);

impl Default for ClassStrides {
    /// The source's roadmap: stride 1 on bilabials, 4 on sustained vowels; the classes between
    /// get 2 (releases, open vowels: fast jaw motion) and 3 (other consonants).
    fn default() -> Self {
        ClassStrides([1.0, 2.0, 2.0, 3.0, 4.0, 4.0])
    }
}

impl ClassStrides {
    pub fn get(&self, c: PhonemeClass) -> f64 {
        self.0[c.index()]
    }

    /// Parses `closure=1,release=2,...`: the classes named are changed, the others keep their
    /// default. Strides are at least 1.
    pub fn parse(s: &str) -> anyhow::Result<ClassStrides> {
        let mut out = ClassStrides::default();
        for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
            let (name, value) =
                part.split_once('=').ok_or_else(|| anyhow::anyhow!("class strides: '{part}' is not CLASS=STRIDE"))?;
            let class = PhonemeClass::parse(name.trim()).ok_or_else(|| {
                let names: Vec<&str> = PhonemeClass::ALL.iter().map(|c| c.name()).collect();
                anyhow::anyhow!("class strides: unknown class '{}' (classes: {})", name.trim(), names.join(", "))
            })?;
            let v: f64 = value
                .trim()
                .parse()
                .map_err(|_| anyhow::anyhow!("class strides: '{}' is not a number", value.trim()))?;
            anyhow::ensure!(v.is_finite() && v >= 1.0, "class strides: {class} stride {v} is below 1");
            out.0[class.index()] = v;
        }
        Ok(out)
    }
}

/// MFA and TIMIT spellings of silence, and espeak-ng's pause symbols.
const SILENCE: [&str; 9] = ["", "sil", "sp", "pau", "h#", "_", "#", "<sil>", "silence"];

/// IPA marks that do not change the class: stress, length, tie bars, the zero-width joiner
/// espeak-ng puts inside diphthongs, syllabicity, and the modifier letters of aspiration,
/// palatalisation, labialisation, velarisation, pharyngealisation and rhoticity.
fn is_ipa_mark(c: char) -> bool {
    matches!(
        c,
        'ˈ' | 'ˌ'
            | 'ː'
            | 'ˑ'
            | '\u{200d}'
            | '\u{200c}'
            | '\u{0361}'
            | '\u{035c}'
            | 'ʰ'
            | 'ʲ'
            | 'ʷ'
            | 'ˠ'
            | 'ˤ'
            | '˞'
            | '.'
    ) || ('\u{0300}'..='\u{036f}').contains(&c)
}

/// The class of one label, or None when the table does not know it.
pub fn classify(label: &str) -> Option<PhonemeClass> {
    use PhonemeClass::*;
    let raw = label.trim();
    if SILENCE.iter().any(|s| s.eq_ignore_ascii_case(raw)) {
        return Some(Silence);
    }
    if raw.eq_ignore_ascii_case("spn") {
        return Some(DEFAULT_CLASS);
    }
    // ARPAbet: upper-case letters and an optional stress digit.
    if !raw.is_empty() && raw.chars().all(|c| c.is_ascii_uppercase() || c.is_ascii_digit()) {
        let base = raw.trim_end_matches(|c: char| c.is_ascii_digit());
        let stress = &raw[base.len()..];
        if let Some(c) = arpabet(base, stress) {
            return Some(c);
        }
    }
    let ipa: String = raw.chars().filter(|&c| !is_ipa_mark(c)).collect();
    ipa_class(&ipa)
}

fn arpabet(base: &str, stress: &str) -> Option<PhonemeClass> {
    use PhonemeClass::*;
    Some(match base {
        "P" | "B" | "M" | "F" | "V" | "EM" => Closure,
        "T" | "D" | "K" | "G" | "CH" | "JH" | "DX" | "Q" => Release,
        // AH with primary or secondary stress is the open ʌ; unstressed (AH0) is the schwa.
        "AH" if stress == "0" => SustainedVowel,
        "AA" | "AE" | "AH" | "AO" | "AW" | "AY" | "OY" => OpenVowel,
        "IY" | "IH" | "EH" | "EY" | "ER" | "UW" | "UH" | "OW" | "AX" | "AXR" | "IX" | "UX" => SustainedVowel,
        "S" | "Z" | "SH" | "ZH" | "TH" | "DH" | "HH" | "N" | "NG" | "L" | "R" | "W" | "Y" | "EL" | "EN" | "NX" => {
            OtherConsonant
        }
        _ => return None,
    })
}

fn ipa_class(s: &str) -> Option<PhonemeClass> {
    use PhonemeClass::*;
    if s.is_empty() {
        return None;
    }
    // Multi-symbol units first (affricates, diphthongs), then single symbols.
    let unit = match s {
        "tʃ" | "dʒ" | "ts" | "dz" | "tɕ" | "dʑ" | "tɬ" => Some(Release),
        // Syllabic consonants as espeak-ng writes them (ARPAbet EM, EN, EL).
        "əm" => Some(Closure),
        "ən" | "əl" => Some(OtherConsonant),
        "aɪ" | "aʊ" | "ɔɪ" | "ɑɪ" | "ɒɪ" | "ɑʊ" | "ɐɪ" | "ɐʊ" | "æɪ" | "æʊ" | "ʌɪ" | "aɪə" | "aʊə" | "aɪɚ" | "aʊɚ" => {
            Some(OpenVowel)
        }
        "eɪ" | "oʊ" | "əʊ" | "ɪə" | "eə" | "ʊə" | "ɛə" | "ɜʊ" | "ɪɹ" | "ɛɹ" | "ʊɹ" | "oɹ" | "ɔɹ" | "ɑɹ" | "ɜɹ"
        | "ɚ" | "iə" | "ʊɚ" => Some(SustainedVowel),
        _ => None,
    };
    if unit.is_some() {
        return unit;
    }
    let mut chars = s.chars();
    let c = chars.next()?;
    if chars.next().is_some() {
        return None;
    }
    Some(match c {
        'p' | 'b' | 'm' | 'f' | 'v' | 'ɱ' | 'ɸ' | 'β' => Closure,
        't' | 'd' | 'k' | 'g' | 'ɡ' | 'c' | 'ɟ' | 'q' | 'ʔ' | 'ɾ' | 'ʈ' | 'ɖ' => Release,
        'a' | 'ɑ' | 'æ' | 'ɐ' | 'ɒ' | 'ɔ' | 'ʌ' | 'ɶ' => OpenVowel,
        'i' | 'ɪ' | 'e' | 'ɛ' | 'ɜ' | 'ɝ' | 'ɚ' | 'ə' | 'ᵻ' | 'ɨ' | 'ʉ' | 'u' | 'ʊ' | 'o' | 'ɵ' | 'ɘ' | 'ø' | 'œ'
        | 'y' | 'ʏ' | 'ɤ' | 'ɯ' => SustainedVowel,
        's' | 'z' | 'ʃ' | 'ʒ' | 'θ' | 'ð' | 'h' | 'ɦ' | 'n' | 'ŋ' | 'ɲ' | 'l' | 'ɫ' | 'ɬ' | 'ɹ' | 'r' | 'ɻ' | 'w'
        | 'ʍ' | 'j' | 'x' | 'ç' | 'ɣ' | 'χ' | 'ʁ' | 'ʂ' | 'ʐ' | 'ɕ' | 'ʑ' | 'ɳ' | 'ʎ' | 'ʀ' => {
            OtherConsonant
        }
        _ => return None,
    })
}
