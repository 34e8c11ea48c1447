/* SPDX-License-Identifier: MIT */
/* Placeholder: the fold fuzz target is being written. */
#include <stddef.h>
#include <stdint.h>

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
        (void)data;
        (void)size;
        return 0;
}
