"""VisCE²'s prompts, verbatim from the paper (Maeda et al., 2024, Table 5 and the ablation).

Named constants, so the prompts are tested and fingerprinted instead of living inside f-strings.
The image always comes first in the conversation; the chat template of the model wraps the text.
"""

from __future__ import annotations

from dataclasses import dataclass

CONTEXT_PROMPT = (
    "Analyze the uploaded image and provide a structured output focusing on the objects, their features, "
    "and the relationships between them. Select up to five of the most important elements. The output "
    "should be organized as follows: List of Important Objects (up to five): - Object 1: [Brief "
    "description] - Object 2: [Brief description] - (Continue as necessary, up to five objects) Features "
    "(Specific characteristics and attributes of each object, such as color, shape, size, and texture): - "
    "Features of Object 1: [Detailed description of features] - Features of Object 2: [Detailed "
    "description of features] - (Continue as necessary for each selected object) Relationships (The way "
    "objects interact or are positioned relative to each other, without using specific object names or "
    "symbols): - Description of a relationship: [General description] - Another relationship: [General "
    "description] - (Continue as necessary for each relevant relationship) Focus on providing unique and "
    "detailed insights into the features and relationships of the selected objects up to five objects."
)
"""Step 1 of VisCE² (paper, Table 5, "VisCE² Step 1"): the structured visual context of an image."""

DESCRIPTION_PROMPT = "Generate a detailed description for the given image."
"""Step 1 of the Description ablation: a free description instead of the structured context."""

RATING_PROMPT = (
    "On a precise scale from 0 to 100, rate whether the candidate caption is appropriate for the given "
    "image. Candidate caption: {caption} Use the image and following visual context to evaluate the "
    "candidate caption: Visual context: {context} Your final rating must be a single digit between 0 and 100."
)
"""Step 2 of VisCE² (and of the Description ablation): the rating of one caption, given the context."""

VANILLA_PROMPT = (
    "On a precise scale from 0 to 100, rate whether the candidate caption is appropriate for the given "
    "image. Candidate caption: {caption} Your rating must be a single digit between 0 and 100."
)
"""The Vanilla ablation: the rating without a visual context (one step)."""

COT_SUFFIX = " Let's think step by step."
"""Appended to the Vanilla prompt for the CoT ablation."""


@dataclass(frozen=True)
class Variant:
    """One of the paper's prompt set-ups: the step-1 prompt (None: no context step) and the rating prompt."""

    name: str
    context_prompt: str | None
    rating_prompt: str


VARIANTS: dict[str, Variant] = {
    "visce2": Variant("visce2", CONTEXT_PROMPT, RATING_PROMPT),
    "vanilla": Variant("vanilla", None, VANILLA_PROMPT),
    "cot": Variant("cot", None, VANILLA_PROMPT + COT_SUFFIX),
    "description": Variant("description", DESCRIPTION_PROMPT, RATING_PROMPT),
}
"""VisCE² itself and the paper's ablations (Vanilla, CoT, Description), by ``--visce2-variant`` name."""

ALL_PROMPTS = (CONTEXT_PROMPT, DESCRIPTION_PROMPT, RATING_PROMPT, VANILLA_PROMPT + COT_SUFFIX)


def rating_text(variant: Variant, caption: str, context: str | None) -> str:
    """The step-2 prompt of ``caption`` (``context`` is required exactly when the variant has step 1)."""
    if variant.context_prompt is None:
        return variant.rating_prompt.format(caption=caption)
    if context is None:
        raise ValueError(f"variant {variant.name!r} needs the image's visual context")
    return variant.rating_prompt.format(caption=caption, context=context)
