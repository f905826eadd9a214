"""Visual-T5 for every user: the install check against the authors' outputs (`check`), the paper's
synthetic VQA set built on the engine (`data`) and Visual-T5 training on it (`train`)."""
