"""MorseDecode: decode a word sent in International Morse code as beeps.

* **Task** -- the clip beeps one word in Morse code (dot = 1 unit, dash = 3, 1 unit between
  the elements of a letter, 3 units between letters); say the word.
* **Observation** -- one user message: the instructions and a mono 16 kHz clip (2-3.5 s).
* **Action** -- free text ending with the word as ``\\boxed{WORD}`` (case is ignored).
* **Reward** -- 1.0 for the right word, 0.1 for a well-formed wrong one (letters and digits
  only), else 0; ``success`` means the right word.
* **Difficulty** -- ``easy``: a 3-letter English word at 20 wpm, chosen from 6 listed
  candidates. ``medium``: a 4-letter English word at 24 wpm, no list, light noise.
  ``hard``: 5 random letters at 28 wpm, a random beep pitch and noise at 8 dB SNR.
"""

from __future__ import annotations

import re
import string
from dataclasses import dataclass

import numpy as np

from relax_gym.types import AudioPart

from ._audio import SAMPLE_RATE, add_noise, concat, silence, tone
from ._base import BoxedAnswerEnv, Task

CODE: dict[str, str] = {
    "A": ".-", "B": "-...", "C": "-.-.", "D": "-..", "E": ".", "F": "..-.", "G": "--.", "H": "....",
    "I": "..", "J": ".---", "K": "-.-", "L": ".-..", "M": "--", "N": "-.", "O": "---", "P": ".--.",
    "Q": "--.-", "R": ".-.", "S": "...", "T": "-", "U": "..-", "V": "...-", "W": ".--", "X": "-..-",
    "Y": "-.--", "Z": "--..",
}
WORDS3 = (
    "CAT DOG SUN SEA SKY RED BOX CUP HAT MAP PEN KEY BUS CAR OWL FOX BEE ANT EGG ICE "
    "OIL JAM TEA PIE ARM LEG EYE EAR LIP TOE WEB NET FAN BAG BED TOY ZIP GYM JET VAN"
).split()
WORDS4 = (
    "BIRD FISH TREE ROAD SHIP SNOW RAIN WIND STAR MOON LAMP DOOR BOOK DESK FORK SOAP "
    "MILK CAKE RICE CORN LION BEAR WOLF DEER FROG DUCK GOAT KITE DRUM BELL COIN RING "
    "ROPE SAND ROCK LEAF SEED WAVE GOLD IRON"
).split()
_WORD_RE = re.compile(r"^[A-Z0-9]+$")


@dataclass(frozen=True)
class Level:
    vocabulary: tuple[str, ...] | None   # None: random letters
    letters: int
    wpm: float
    choices: int                         # candidates listed in the prompt (0: none)
    pitch_hz: tuple[float, float]
    snr_db: float | None


LEVELS = {
    "easy": Level(tuple(WORDS3), 3, 20, 6, (700, 700), None),
    "medium": Level(tuple(WORDS4), 4, 24, 0, (600, 800), 20.0),
    "hard": Level(None, 5, 28, 0, (500, 900), 8.0),
}


def morse_units(word: str) -> list[tuple[bool, int]]:
    """The word as (key down?, length in units) runs, letters separated by 3-unit gaps."""
    runs: list[tuple[bool, int]] = []
    for i, letter in enumerate(word):
        if i:
            runs.append((False, 3))
        for j, element in enumerate(CODE[letter]):
            if j:
                runs.append((False, 1))
            runs.append((True, 1 if element == "." else 3))
    return runs


class MorseDecodeEnv(BoxedAnswerEnv[Level]):
    """Decode a Morse-code word from beeps; answer ``\\boxed{WORD}``."""

    levels = LEVELS
    modalities = ("text", "audio")
    tags = ("audio", "decoding")

    def make_task(self, level: Level) -> Task:
        rng = self.np_random
        if level.vocabulary is None:
            word = "".join(str(c) for c in rng.choice(list(string.ascii_uppercase), size=level.letters))
        else:
            word = str(rng.choice(level.vocabulary))
        unit_s = 1.2 / level.wpm
        pitch = float(rng.uniform(*level.pitch_hz))
        pieces = [silence(0.15)]
        for down, units in morse_units(word):
            pieces.append(tone(pitch, units * unit_s, 0.5) if down else silence(units * unit_s))
        pieces.append(silence(0.15))
        wave = add_noise(concat(pieces), level.snr_db, rng)
        self._choices: tuple[str, ...] = ()
        kind = "random letters" if level.vocabulary is None else "an English word"
        listing = ""
        if level.choices and level.vocabulary is not None:
            others = [w for w in level.vocabulary if w != word]
            picked = [str(w) for w in rng.choice(others, size=level.choices - 1, replace=False)]
            self._choices = tuple(sorted([word, *picked]))
            listing = f" It is one of: {', '.join(self._choices)}."
        prompt = (
            f"The audio clip spells {level.letters} letters ({kind}) in International Morse code: "
            "short beeps are dots, long beeps dashes, and longer silences separate letters."
            f"{listing} Reply with the decoded letters as \\boxed{{...}}."
        )
        return Task(prompt, word, word, (AudioPart(wave, SAMPLE_RATE, id="morse"),), {"wpm": level.wpm})

    def parse_answer(self, raw: str) -> str | None:
        word = re.sub(r"\s", "", raw).upper()
        return word if _WORD_RE.match(word) else None

    def random_answer(self, rng: np.random.Generator) -> str:
        """A listed candidate, else a vocabulary word, else random letters."""
        self.require_task()
        if self._choices:
            return str(rng.choice(self._choices))
        if self.level.vocabulary is not None:
            return str(rng.choice(self.level.vocabulary))
        return "".join(str(c) for c in rng.choice(list(string.ascii_uppercase), size=self.level.letters))
