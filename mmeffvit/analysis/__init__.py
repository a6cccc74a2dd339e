"""Analysis: MACs and parameters by tracing (tools/analysis/get_flops.py); the attention maps of
every family's attention modules (``attention_maps``, ``attention_kinds``; imported from there,
used by tools/analysis/vis_attention.py); the model zoo tables (``zoo``,
tools/analysis/model_zoo.py); what one benchmark child measures and how the report is drawn
(``benchmark_worker``, ``benchmark_report``: tools/analysis/benchmark.py, profile_backbone.py)."""
from .complexity import ComplexityReport, analyze, count_params, format_report
from .models import (ImageNetClassifier, backbone_complexity, build_backbone, build_classifier,
                     config_complexity)

__all__ = [
    'ComplexityReport', 'ImageNetClassifier', 'analyze', 'backbone_complexity', 'build_backbone',
    'build_classifier', 'config_complexity', 'count_params', 'format_report'
]
