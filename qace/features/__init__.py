"""Region features from where users have them: published feature files read in place
(`qace.features.formats`) and raw images through the bottom-up-attention detector
(`qace.features.detector`, driven by `qace.features.extract`)."""
