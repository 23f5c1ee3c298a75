"""Contrast questions: a product check that reuse answers from the right document when another document
says the opposite (issue 28's shipping rule).

Each case is hand-written, in the shape of issue 17's newcomer case ("What does the warranty cover?" over a
coverage note and an FAQ listing what the warranty does NOT cover, where linked reuse answered with the
exclusions): a question, the document that answers it, and a contrast document on the same subject that lists
the opposite (exclusions, prohibitions, closures, side effects) in words close to the question's. Nothing here
is generated or trained on: ``train-links`` never sees these documents, so the check is held out from every
training task (the polarity task of :mod:`training.polarity` generates its own subjects and items, none of them
these cases' phrases: tested).

An example has the shape of :class:`evaluation.nq.NQExample` and :func:`build_documents` the signature of
:func:`evaluation.nq.build_documents`, so every evaluation mode runs on it unchanged (``eval --task contrast
--docs 2 --gold-position first,last`` asks each case in both orders). Metric: :func:`contrast_match` - an
answer scores when it names something from the answering document and nothing from the contrast document.

No torch here.
"""

from __future__ import annotations

import random
from dataclasses import dataclass

from evaluation.contrast_more import MORE
from evaluation.nq import NQExample, best_subspan_em, gold_slot, normalize_answer
from kvlink_rag.types import Document


@dataclass(frozen=True)
class ContrastExample(NQExample):
    """One case: ``answers`` are phrases of ``gold`` that answer the question, ``wrong`` phrases of
    ``contrast`` (the document saying the opposite) that must not appear in the answer."""

    contrast: Document
    wrong: tuple[str, ...]


def _case(question: str, gold: str, answers: str, contrast: str, wrong: str) -> ContrastExample:
    return ContrastExample(question, tuple(answers.split("|")), Document(gold), Document(contrast),
                           tuple(wrong.split("|")))


CASES: tuple[ContrastExample, ...] = (
    _case("What does the warranty cover?",
          "Warranty. The Model X kettle comes with a two-year limited warranty. The warranty covers defects in "
          "materials and workmanship, including a faulty heating element, a broken thermostat and a leaking base. "
          "If your kettle fails within two years of purchase, we repair or replace it free of charge.",
          "defects|heating element|thermostat|leaking base|repair or replace",
          "Frequently asked questions. What is not covered? The warranty does not cover limescale build-up, damage "
          "from dropping the kettle, use with the wrong voltage, cosmetic scratches or commercial use. How do I "
          "make a claim? Email support with your receipt and a photo of the fault.",
          "limescale|dropping|voltage|scratches|commercial"),
    _case("What is included in the membership?",
          "Membership. Your monthly membership at Riverside Gym includes access to the swimming pool, the sauna "
          "and all group classes, seven days a week.",
          "swimming pool|pool|sauna|group classes",
          "Extra charges. Personal training, towel rental and the climbing wall are not included in the "
          "membership and cost extra at Riverside Gym.",
          "personal training|towel|climbing"),
    _case("Which items can be returned?",
          "Returns. Unworn shoes, unopened electronics and books can be returned within 30 days of purchase for a "
          "full refund.",
          "shoes|electronics|books",
          "Final sale. Swimwear, gift cards and opened software cannot be returned or exchanged.",
          "swimwear|gift cards|software"),
    _case("What can library members borrow?",
          "Lending. Library members can borrow novels, DVDs and board games for up to three weeks.",
          "novels|dvds|board games",
          "Reference collection. Newspapers, rare maps and encyclopedias cannot be borrowed by members and must "
          "stay in the reading room.",
          "newspapers|maps|encyclopedias"),
    _case("Which dishes are vegetarian?",
          "Vegetarian dishes. The mushroom risotto, the spinach lasagne and the lentil soup contain no meat or "
          "fish.",
          "mushroom risotto|risotto|spinach lasagne|lasagne|lentil soup",
          "Meat dishes. The beef stew, the chicken curry and the pork dumplings are not vegetarian.",
          "beef|chicken|pork"),
    _case("On which days is the museum open?",
          "Opening hours. The city museum is open on Wednesday, Thursday and Saturday from 10 am to 6 pm.",
          "wednesday|thursday|saturday",
          "Closures. The city museum is closed on Monday, Tuesday and on public holidays.",
          "monday|tuesday|holidays"),
    _case("Which costs does the travel insurance pay for?",
          "Cover. The travel insurance pays for emergency medical treatment, lost luggage and cancelled flights.",
          "medical|luggage|cancelled flights",
          "Exclusions. The travel insurance does not pay for injuries from skydiving, theft from an unlocked car "
          "or trips longer than 90 days.",
          "skydiving|theft|unlocked|90 days"),
    _case("Where is parking allowed?",
          "Parking. Parking is allowed in the north car park and on Elm Street after 6 pm.",
          "north car park|car park|elm street",
          "No parking. Parking is forbidden in front of the fire station, on the bridge and in the loading zone.",
          "fire station|bridge|loading zone"),
    _case("What may passengers bring in their carry-on bag?",
          "Carry-on bags. Passengers may bring a laptop, a small umbrella and snacks in their carry-on bag.",
          "laptop|umbrella|snacks",
          "Prohibited items. Knives, fireworks and bottles of more than 100 ml may not be carried in a carry-on "
          "bag.",
          "knives|fireworks|bottles|100 ml"),
    _case("What is Lorvex used to treat?",
          "Uses. Lorvex tablets are used to treat hay fever, seasonal allergies and itchy eyes.",
          "hay fever|allergies|itchy eyes",
          "Side effects. Lorvex tablets may cause headaches, a dry mouth and drowsiness.",
          "headache|dry mouth|drowsiness"),
    _case("What goes in the blue recycling bin?",
          "Recycling. The blue recycling bin takes paper, cardboard and glass bottles.",
          "paper|cardboard|glass",
          "Do not recycle. Never put plastic bags, batteries or food waste in the blue recycling bin.",
          "plastic bags|batteries|food waste"),
    _case("Which features does the free plan include?",
          "Free plan. The free plan includes five projects, email support and two gigabytes of storage.",
          "five projects|projects|email support|storage|gigabytes",
          "Paid features. Custom domains, phone support and team accounts are not part of the free plan.",
          "custom domains|domains|phone support|team accounts"),
    _case("What must students wear at school?",
          "Uniform. At school, students must wear a navy blazer, grey trousers and black shoes.",
          "blazer|grey trousers|trousers|black shoes",
          "Not allowed. At school, students must not wear jewellery, trainers or hooded jumpers.",
          "jewellery|trainers|hooded"),
    _case("Which animals does the pet hotel accept?",
          "Guests. The Happy Paws pet hotel accepts dogs, cats and rabbits for stays of up to two weeks.",
          "dogs|cats|rabbits",
          "Other animals. The Happy Paws pet hotel does not accept snakes, parrots or horses.",
          "snakes|parrots|horses"),
    _case("Which plants grow best in full sun?",
          "Sunny beds. Lavender, rosemary and sunflowers grow best in full sun.",
          "lavender|rosemary|sunflowers",
          "Shade plants. Ferns, hostas and moss do not grow well in full sun and should be kept in the shade.",
          "ferns|hostas|moss"),
    _case("Who can apply for the Baxter scholarship?",
          "Eligibility. The Baxter scholarship is open to first-year students, part-time students and students "
          "from abroad.",
          "first-year|first year|part-time|part time|abroad",
          "Who cannot apply. The Baxter scholarship is not open to graduates, university staff or students who "
          "already hold another grant.",
          "graduates|staff|another grant"),
)
FIRST = len(CASES)
"""The first set's 16 cases (the shipping rule's contrast check until 2026-12-06d: ``eval --task contrast --n 16``)."""
CASES += tuple(_case(*c) for c in MORE)
"""All 48 cases (each asked in both document orders by ``--gold-position first,last``): the first set's 16, then
:data:`evaluation.contrast_more.MORE`."""
MAX_DOCS = len(CASES) + 1
"""Most documents a contrast question takes: its two and every other case's answering document."""
_WRONG = {c.answers: c.wrong for c in CASES}


def contrast_match(prediction: str, answers: list[str] | tuple[str, ...]) -> float:
    """1.0 if ``prediction`` contains an answer of the case whose ``answers`` these are (normalised, as
    :func:`evaluation.nq.best_subspan_em`) and none of its contrast document's ``wrong`` phrases, else 0.0.

    Raises:
        KeyError: ``answers`` are not a case's.
    """
    pred = normalize_answer(prediction)
    if any(normalize_answer(w) in pred for w in _WRONG[tuple(answers)]):
        return 0.0
    return best_subspan_em(prediction, answers)


def make_examples(n: int | None = None) -> list[ContrastExample]:
    """The first ``n`` cases (all 48 by default; the first set is ``n=16``). Raises ValueError: ``n`` below 1."""
    if n is not None and n < 1:
        raise ValueError(f"number of questions ({n}) must be >= 1")
    return list(CASES[:n])


def build_documents(examples: list[ContrastExample], index: int, n_docs: int, gold_position: str = "random",
                    seed: int = 0) -> tuple[list[Document], int]:
    """The answering document and its contrast document, plus ``n_docs - 2`` other cases' answering documents
    (unrelated subjects, drawn with ``random.Random(seed * 1_000_003 + index)``); the answering document at
    ``gold_position`` and the contrast document right after it (before it at the last slot). Returns
    ``(documents, gold_slot)``, as :func:`evaluation.nq.build_documents`.

    Raises:
        ValueError: index out of range, ``n_docs`` below 2 or above the number of cases + 1, unknown position.
    """
    if not 0 <= index < len(examples):
        raise ValueError(f"index {index} out of range 0..{len(examples) - 1}")
    if not 2 <= n_docs <= MAX_DOCS:
        raise ValueError(f"contrast questions take 2..{MAX_DOCS} documents (the answer and its contrast), "
                         f"not {n_docs}")
    ex = examples[index]
    rng = random.Random(seed * 1_000_003 + index)
    others = rng.sample([c.gold for c in CASES if c.answers != ex.answers], n_docs - 2)
    slot = gold_slot(gold_position, n_docs, rng)
    pair = [ex.gold, ex.contrast] if slot < n_docs - 1 else [ex.contrast, ex.gold]
    start = slot if slot < n_docs - 1 else slot - 1
    return [*others[:start], *pair, *others[start:]], slot
