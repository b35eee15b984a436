"""A bare-metal Cortex-M build of a generated model, for QEMU's MPS2 boards (``mps2-an386``: Cortex-M4,
4 MiB of code memory at 0, 4 MiB of RAM at 0x20000000): a vector table and reset handler, ``.data``/``.bss``
set up by hand, memmove/memcpy/memset, semihosting for the report and the exit, and a ``main`` that runs the
model on embedded samples and prints each output as hex. No C library, no float: the ELF's only library is
libgcc (64-bit division and multiplication helpers).
"""

from __future__ import annotations

import os
import shutil
import subprocess

import numpy as np

LINKER = """
MEMORY { FLASH (rx) : ORIGIN = 0x00000000, LENGTH = 4M  RAM (rwx) : ORIGIN = 0x20000000, LENGTH = 4M }
ENTRY(reset)
SECTIONS {
  .vectors : { KEEP(*(.vectors)) } > FLASH
  .text : { *(.text*) *(.rodata*) } > FLASH
  .ARM.exidx : { *(.ARM.exidx*) } > FLASH
  _data_load = LOADADDR(.data);
  .data : { _data = .; *(.data*) _edata = .; } > RAM AT > FLASH
  .bss (NOLOAD) : { _bss = .; *(.bss*) *(COMMON) _ebss = .; } > RAM
  _stack_top = ORIGIN(RAM) + LENGTH(RAM);
}
"""

STARTUP = r"""
#include <stddef.h>
#include <stdint.h>

extern uint32_t _data_load, _data, _edata, _bss, _ebss, _stack_top;
int main(void);
void reset(void);
static void fault(void) { for (;;) {} }
__attribute__((section(".vectors"), used)) static const void *vectors[16] = {
  &_stack_top, (void *)reset, (void *)fault, (void *)fault, (void *)fault, (void *)fault, (void *)fault,
  0, 0, 0, 0, (void *)fault, (void *)fault, 0, (void *)fault, (void *)fault};

static int semihost(int op, const void *arg) {
  register int r0 __asm__("r0") = op;
  register const void *r1 __asm__("r1") = arg;
  __asm__ volatile("bkpt 0xab" : "+r"(r0) : "r"(r1) : "memory");
  return r0;
}
void put(const char *s) { semihost(0x04, s); }
void put_hex(uint32_t v, int digits) {
  char b[9];
  int k;
  for (k = 0; k < digits; k++) b[k] = "0123456789abcdef"[(v >> (4 * (digits - 1 - k))) & 15];
  b[digits] = 0;
  put(b);
}
void *memcpy(void *d, const void *s, size_t n) {
  uint8_t *a = d; const uint8_t *b = s; while (n--) *a++ = *b++; return d;
}
void *memmove(void *d, const void *s, size_t n) {
  uint8_t *a = d; const uint8_t *b = s;
  if (a < b) { while (n--) *a++ = *b++; } else { a += n; b += n; while (n--) *--a = *--b; }
  return d;
}
void *memset(void *d, int c, size_t n) { uint8_t *a = d; while (n--) *a++ = (uint8_t)c; return d; }
void reset(void) {
  uint32_t *s = &_data_load, *d = &_data;
  while (d < &_edata) *d++ = *s++;
  for (d = &_bss; d < &_ebss;) *d++ = 0;
  /* SYS_EXIT; on AArch32 the reason itself: ADP_Stopped_ApplicationExit */
  if (main() == 0) semihost(0x18, (const void *)0x20026);
  semihost(0x18, (const void *)0x20023);  /* ADP_Stopped_RunTimeErrorUnknown */
  fault();
}
"""


def main_c(prefix: str, header: str, inputs: np.ndarray, in_ctype: str, out_ctype: str, out_size: int) -> str:
    """``main``: the model on each embedded sample, each output element printed as 8 hex digits."""
    flat = inputs.reshape(len(inputs), -1)
    rows = ",\n".join("  {" + ", ".join(str(int(v)) for v in r) + "}" for r in flat)
    return f"""#include "{header}"
void put(const char *s);
void put_hex(uint32_t v, int digits);
/* the CMSDK APB timer 0 of the MPS2 boards, counting down at the 25 MHz system clock; under QEMU with
   -icount shift=0 one instruction is 1 ns of virtual time: 40 instructions a tick */
#define TIMER_CTRL (*(volatile uint32_t *)0x40000000u)
#define TIMER_VALUE (*(volatile uint32_t *)0x40000004u)
#define TIMER_RELOAD (*(volatile uint32_t *)0x40000008u)
static const {in_ctype} samples[{len(flat)}][{flat.shape[1]}] = {{
{rows}
}};
static {out_ctype} out[{out_size}];
int main(void) {{
  int i, k;
  uint32_t t0, t1;
  TIMER_RELOAD = 0xffffffffu;
  TIMER_VALUE = 0xffffffffu;
  TIMER_CTRL = 1u;
  for (i = 0; i < {len(flat)}; i++) {{
    t0 = TIMER_VALUE;
    if ({prefix}_run(samples[i], out) != 0) put("fail\\n");
    t1 = TIMER_VALUE;
    put("ticks ");
    put_hex(t0 - t1, 8);
    put("\\n");
    for (k = 0; k < {out_size}; k++) {{
      put_hex((uint32_t)(int32_t)out[k], 8);
      put(k + 1 < {out_size} ? " " : "\\n");
    }}
  }}
  put("done\\n");
  return 0;
}}
"""


#: -mcpu values and what each core lacks
CPUS = {"cortex-m4": ["-mcpu=cortex-m4", "-mthumb", "-mfloat-abi=soft"],
        "cortex-m0plus": ["-mcpu=cortex-m0plus", "-mthumb", "-mfloat-abi=soft"]}


TOOLS = {"gcc": "arm-none-eabi-gcc", "nm": "arm-none-eabi-nm", "objdump": "arm-none-eabi-objdump",
         "size": "arm-none-eabi-size", "qemu": "qemu-system-arm"}


def tools() -> dict[str, str | None]:
    """The cross toolchain's and QEMU's paths (None where missing)."""
    return {k: shutil.which(v) for k, v in TOOLS.items()}


def build(folder: str, c_text: str, h_text: str, prefix: str, main_text: str, cpu: str) -> str:
    """Compile and link the model, startup and main for ``cpu`` in ``folder``; returns the ELF's path."""
    t = tools()
    files = {f"{prefix}.c": c_text, f"{prefix}.h": h_text, "startup.c": STARTUP, "main.c": main_text,
             "link.ld": LINKER}
    for name, text in files.items():
        with open(os.path.join(folder, name), "w") as f:
            f.write(text)
    elf = os.path.join(folder, f"{prefix}_{cpu}.elf")
    cmd = [t["gcc"], *CPUS[cpu], "-std=c99", "-O2", "-Wall", "-Wextra", "-Werror", "-fno-strict-aliasing",
           "-ffreestanding", "-nostdlib", "-T", "link.ld", f"{prefix}.c", "startup.c", "main.c", "-lgcc",
           "-o", elf]
    subprocess.run(cmd, cwd=folder, check=True, capture_output=True, text=True)
    return elf


def parse(output: str, dtype) -> tuple[np.ndarray, list[int]]:
    """The outputs (one row a sample) and the approximate instruction count of each run (40 a timer tick,
    with QEMU's ``-icount shift=0``) from :func:`run_qemu`'s text."""
    rows, counts = [], []
    for ln in output.splitlines():
        if ln.startswith("ticks "):
            counts.append(int(ln.split()[1], 16) * 40)
        elif ln and ln != "done":
            rows.append([np.uint32(int(v, 16)).astype(np.int32) for v in ln.split()])
    return np.array(rows, np.int64).astype(dtype), counts


def run_qemu(elf: str, timeout: float = 300) -> str:
    """The ELF's semihosting output (QEMU writes it to stderr) under ``qemu-system-arm -M mps2-an386``."""
    t = tools()
    cmd = [t["qemu"], "-M", "mps2-an386", "-nographic", "-semihosting", "-monitor", "none", "-serial",
           "none", "-icount", "shift=0", "-kernel", elf]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, check=True)
    return done.stdout + done.stderr


def float_symbols(elf: str) -> list[str]:
    """Symbols of the ELF that are float routines (``__aeabi_f*``, ``__aeabi_d*``, libgcc's soft-float)."""
    out = subprocess.run([tools()["nm"], elf], capture_output=True, text=True, check=True).stdout
    names = [ln.split()[-1] for ln in out.splitlines() if ln.strip()]
    float_like = ("__aeabi_f", "__aeabi_d", "__aeabi_i2f", "__aeabi_i2d", "__aeabi_l2f", "__aeabi_l2d",
                  "__aeabi_ui2", "__aeabi_ul2", "__addsf", "__adddf", "__mulsf", "__muldf", "__divsf",
                  "__divdf", "__floatsi", "__floatdi", "__fix")
    return [n for n in names if n.startswith(float_like)]


def vfp_instructions(elf: str) -> list[str]:
    """Disassembled VFP/FPU instructions (``vadd``, ``vmov``, ``vldr``, ...) in the ELF."""
    out = subprocess.run([tools()["objdump"], "-d", elf], capture_output=True, text=True, check=True).stdout
    found = []
    for ln in out.splitlines():
        fields = ln.split("\t")  # address:, encoding, mnemonic, operands
        if len(fields) >= 3 and fields[0].strip().endswith(":") and fields[2].strip().startswith("v"):
            found.append(ln.strip())
    return found


def sizes(elf: str) -> dict[str, int]:
    """``text``, ``data`` and ``bss`` bytes (flash = text + data, RAM = data + bss)."""
    out = subprocess.run([tools()["size"], elf], capture_output=True, text=True, check=True).stdout
    text, data, bss = (int(v) for v in out.splitlines()[1].split()[:3])
    return {"text": text, "data": data, "bss": bss}
