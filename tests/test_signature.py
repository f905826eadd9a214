"""The one signature type every scorer's signature is built with (`qace.signature`)."""

from __future__ import annotations

import pytest

from qace.config import QACEConfig, build_signature, parse_signature
from qace.errors import ConfigError
from qace.judges.regen import RegenConfig, build_regen_signature
from qace.judges.visce2 import VisCE2Config
from qace.judges.visce2 import build_signature as visce2_signature
from qace.signature import Signature


def test_the_wire_format_is_spec_section_8s() -> None:
    """Metric first, then key:value fields in order, joined by '|' (earlier outputs must still match)."""
    sig = build_signature(QACEConfig(variant="img"), qg="q1", qa="a1", vqa="v1", bertscore="bs_L6")
    assert sig.startswith(
        "QACE-Img|qg:q1|qa:a1|vqa:v1|feat:none|bs:bs_L6|prec:fp32|be:torch|maxin:512|version:"
    )
    assert sig.endswith("|spec:2")
    ref = build_signature(QACEConfig(variant="ref"), qg="q1", qa="a1", vqa="v1", bertscore="bs_L6")
    assert "vqa:" not in ref and ref.startswith("QACE-Ref|qg:q1|qa:a1|bs:bs_L6|")


@pytest.mark.parametrize(
    "text",
    [
        build_signature(QACEConfig(variant="ref"), qg="q", qa="a", vqa=None, bertscore="b"),
        build_regen_signature(RegenConfig(guidance=2.5), generator="g", encoder="e"),
        visce2_signature(VisCE2Config(), "sha256-abc"),
    ],
)
def test_every_scorers_signature_parses_back_to_itself(text: str) -> None:
    parsed = Signature.parse(text)
    assert str(parsed) == text
    assert parse_signature(text) == parsed.as_dict()
    assert parse_signature(text)["metric"] == text.split("|")[0]


def test_qace_img_signature_names_its_features() -> None:
    """#37.7: the store's identity is a field of QACE-Img's signature, left out of the short form."""
    config = QACEConfig(variant="img")
    npz, random = (
        build_signature(config, qg="q", qa="a", vqa="v", bertscore="b", features=identity)
        for identity in ("npz-0123456789ab", "random:0")
    )
    assert "|vqa:v|feat:npz-0123456789ab|bs:b|" in npz and "|feat:random:0|" in random
    assert parse_signature(random)["feat"] == "random:0"
    assert Signature.parse(npz).short() == Signature.parse(random).short()


def test_short_form_drops_the_model_fields_and_keeps_the_rest_in_order() -> None:
    sig = Signature.of("QACE-Ref", ("qg", "sha256-1"), ("qa", "sha256-2"), ("bs", "x_L6"), ("prec", "bf16"))
    assert sig.short() == "QACE-Ref|prec:bf16"
    assert str(sig) == "QACE-Ref|qg:sha256-1|qa:sha256-2|bs:x_L6|prec:bf16"
    regen = Signature.parse(build_regen_signature(RegenConfig(), generator="g", encoder="e"))
    assert "gen:" not in regen.short() and "steps:" in regen.short()


def test_a_field_without_a_colon_is_an_error_naming_it() -> None:
    with pytest.raises(ConfigError, match="'prec'"):
        Signature.parse("QACE-Ref|qg:x|prec")
