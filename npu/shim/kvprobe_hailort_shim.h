/* kvprobe's C ABI over the HailoRT C++ infer-model API (contract §6.3): the KV-cache calls
 * (init_cache, update_cache_offset, get_cache_buffers, update_cache_buffer) exist only in C++.
 * Every function returns a hailo_status (0 = success); kvp_last_error() holds a one-line detail
 * for the calling thread. Handles are owned by the caller and released exactly once. */
#ifndef KVPROBE_HAILORT_SHIM_H
#define KVPROBE_HAILORT_SHIM_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct kvp_vdevice kvp_vdevice;
typedef struct kvp_model kvp_model;

/* Detail of the last failure on this thread ("" if none). Valid until the next shim call. */
const char *kvp_last_error(void);

int kvp_vdevice_create(kvp_vdevice **out);
void kvp_vdevice_release(kvp_vdevice *vdevice);

/* create_infer_model(hef, group) -> set_enable_kv_cache(true) -> FLOAT32 on the named inputs and
 * on every output -> configure() -> page-aligned buffers and bindings. */
int kvp_model_create(kvp_vdevice *vdevice, const char *hef_path, const char *group_name,
                     const char *const *float_inputs, size_t n_float_inputs, kvp_model **out);
void kvp_model_release(kvp_model *model);

/* Names in InferModel order (outputs: the HEF's sorted output order). */
size_t kvp_model_io_count(const kvp_model *model, int is_output);
int kvp_model_io_name(const kvp_model *model, int is_output, size_t index, char *buf, size_t buf_len);
int kvp_model_frame_size(const kvp_model *model, int is_output, const char *name, size_t *size);

int kvp_model_set_input(kvp_model *model, const char *name, const void *data, size_t len);
int kvp_model_run(kvp_model *model, uint32_t timeout_ms);
int kvp_model_get_output(const kvp_model *model, const char *name, void *data, size_t len);

int kvp_model_init_cache(kvp_model *model, uint32_t read_offset);
int kvp_model_update_cache_offset(kvp_model *model, int32_t delta_entries);

/* get_cache_buffers(): snapshot kept inside the model, read with the two calls after it. */
int kvp_model_fetch_cache_buffers(kvp_model *model, size_t *count);
int kvp_model_cache_entry(const kvp_model *model, size_t index, uint32_t *cache_id,
                          const uint8_t **data, size_t *len);
int kvp_model_update_cache_buffer(kvp_model *model, uint32_t cache_id, const void *data, size_t len);

#ifdef __cplusplus
}
#endif

#endif
