#!/usr/bin/env bash
# Regenerates the committed speech fixtures (fixtures/speech/*.wav) that the voice-activity and
# render tests read, so that the test suite needs no text-to-speech engine installed.
# Needs espeak-ng (Debian: apt-get install espeak-ng). Output: 16-bit mono WAV at espeak's 22.05 kHz.
# The voice, rate and texts are part of what the tests assume (sentence lengths, speech spans):
# change them only together with the tests.
set -euo pipefail
cd "$(dirname "$0")/.."
command -v espeak-ng > /dev/null || { echo "espeak-ng not found: apt-get install espeak-ng" >&2; exit 1; }
out=fixtures/speech
mkdir -p "$out"
speak() { # name words-per-minute text
    espeak-ng -v en-us -s "$2" -w "$out/$1.wav" "$3"
}
# media/tests/vad.rs: two sentences joined around an exact 2 s pause.
speak fox 150 "The quick brown fox jumps over the lazy dog"
speak sleep 150 "Then everybody went home to sleep"
# cli/tests/render.rs: two sentences joined around a 2.5 s pause.
speak news 160 "Good evening, here is the news."
speak goodnight 160 "Thank you, and good night."
espeak-ng --version > "$out/GENERATOR.txt"
ls -l "$out"
