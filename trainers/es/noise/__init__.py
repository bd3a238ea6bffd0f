"""ES perturbations, below the engines that evaluate them: full-rank Gaussian noise (``fullrank.py``),
low-rank populations (``lowrank.py``) and the member types an engine call takes (``members.py``)."""
