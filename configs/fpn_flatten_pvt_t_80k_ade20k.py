# The README's segmentation command trains this file: a stable entry point kept at the top of
# configs/ under its original name. It is flatten/fpn_flatten_pvt_t_80k_ade20k.py unchanged
# (Semantic FPN, FLatten-PVT-T, ADE20K 80k); edit that file, not this one. The default work_dir
# follows this file's name.
_base_ = ['./flatten/fpn_flatten_pvt_t_80k_ade20k.py']
