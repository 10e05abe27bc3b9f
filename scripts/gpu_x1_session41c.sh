#!/usr/bin/env bash
# One H100 command (stop 41, third): 41b's command again after the kernel's rework (the weights
# loaded before the gathers, the butterflies level by level over the entries, no volatile asm,
# the Gram term's vector fenced), at f = 64 / 128 / 256 (implicit, explicit).
#   source .whl/gpu-opencl.sh activate && OUT=$OUT bash scripts/gpu_x1_session41c.sh
FACTORS=64,128,256 exec bash "$(dirname "$0")/gpu_x1_session41b.sh"
