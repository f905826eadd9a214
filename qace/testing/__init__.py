"""Builders of the tiny test models (scores mean nothing): QACE's qg/tqa/vqa (`qace.testing.qace_models`,
what `qace make-test-models` runs), the VisCE² vision-language model (`qace.testing.vlm`) and the
regeneration judge's generator and encoder (`qace.testing.regen`) and the bottom-up-attention detector
(`qace.testing.detector`); the judges' demo scorers the registry names (`qace.testing.demos`: real
models when loadable, else these, cached under `qace.testing.home.test_models_home`). Tests, demos and
benchmarks use them; scoring code never imports them."""
