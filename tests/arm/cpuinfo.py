"""An arm64 ``/proc/cpuinfo`` for a QEMU CPU model, printed to stdout.

QEMU user mode hands the guest the host's (x86) ``/proc/cpuinfo``, on which onnxruntime's CPU detection
crashes; with ``-L SYSROOT`` it opens ``SYSROOT/proc/cpuinfo`` instead, so ``run.sh`` writes this there: the
model's MIDR fields (QEMU's values) and its HWCAP feature names.

onnxruntime 1.31's CPU detection also crashes at import on a MIDR whose core it does not know (QEMU's
``a64fx``, Fujitsu 0x46/0x001, and ``max``, 0x00/0x051, measured): those two get a stand-in core's MIDR with
the same 8-bit dot-product support (the kernels follow the HWCAPs QEMU reports, not the MIDR), so messages
there name the stand-in.
"""

from __future__ import annotations

import sys

BASE = "fp asimd evtstrm aes pmull sha1 sha2 crc32 cpuid"
V82 = BASE + " atomics fphp asimdhp asimdrdm lrcpc dcpop"
#: QEMU model -> (MIDR, Features)
MODELS = {
    "cortex-a53": (0x410FD034, BASE),
    "cortex-a57": (0x411FD070, BASE),
    "cortex-a72": (0x410FD083, BASE),
    "cortex-a76": (0x414FD0B1, V82 + " asimddp ssbs"),
    "neoverse-n1": (0x414FD0C1, V82 + " asimddp ssbs"),
    "a64fx": (0x461F0010, "fp asimd evtstrm sha1 sha2 crc32 atomics fphp asimdhp cpuid asimdrdm fcma dcpop"
              " sve"),
    "max": (0x000F0510, V82 + " jscvt fcma sha3 sm3 sm4 asimddp sha512 sve asimdfhm dit uscat ilrcpc flagm"
            " ssbs sb paca pacg dcpodp sve2 sveaes svepmull svebitperm svesha3 svesm4"
            " flagm2 frint svei8mm svebf16 i8mm bf16 dgh rng bti mte"),
}
#: models whose MIDR onnxruntime's CPU detection crashes on -> the core whose MIDR is written instead
STAND_IN = {"a64fx": "cortex-a72", "max": "neoverse-n1"}


def cpuinfo(model: str, cores: int = 1, real: bool = False) -> str:
    """The model's /proc/cpuinfo (with its stand-in's MIDR unless ``real``)."""
    features = MODELS[model][1]
    midr = MODELS[model if real else STAND_IN.get(model, model)][0]
    block = [
        "BogoMIPS\t: 100.00",
        f"Features\t: {features}",
        f"CPU implementer\t: 0x{midr >> 24:02x}",
        f"CPU architecture: {8}",
        f"CPU variant\t: 0x{(midr >> 20) & 0xF:x}",
        f"CPU part\t: 0x{(midr >> 4) & 0xFFF:03x}",
        f"CPU revision\t: {midr & 0xF}",
    ]
    return "".join(f"processor\t: {i}\n" + "\n".join(block) + "\n\n" for i in range(cores))


if __name__ == "__main__":
    sys.stdout.write(cpuinfo(sys.argv[1]))
