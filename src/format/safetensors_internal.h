/* safetensors_internal: what the safetensors reader and writer share and nobody else needs: the
 * mapping between safetensors dtype strings ("F32", "BF16") and CSD_DTYPE_* values, and limits.
 * Only F32, F16 and BF16 map to a CSD dtype; other safetensors dtypes are known but refused. */
#ifndef CSD_SAFETENSORS_INTERNAL_H
#define CSD_SAFETENSORS_INTERNAL_H

#include <stddef.h>

/* Caps the tensor count of one set so index arithmetic stays in int and tables stay small;
 * real checkpoints have at most a few thousand tensors. */
#define CSD_ST_MAX_TENSORS (1 << 20)

/* Returned by csd_st_dtype_from_name for dtypes the format defines but we do not load. */
#define CSD_ST_DTYPE_UNSUPPORTED (-2)

/* CSD_DTYPE_F32/F16/BF16 for "F32"/"F16"/"BF16"; CSD_ST_DTYPE_UNSUPPORTED for other dtypes of the
 * safetensors spec (F64, I8, BOOL, F8_E4M3, ...); -1 for anything else. */
int csd_st_dtype_from_name(const char *name);
/* "F32", "F16", "BF16"; NULL for any other CSD dtype. */
const char *csd_st_dtype_name(int dtype);
/* Bytes per element of a loadable dtype; 0 for any other. */
size_t csd_st_dtype_size(int dtype);

#endif
