/* The emulator's C ABI (npu/standin/src/lib.rs), called by the C++ front only. */
#ifndef KVPROBE_STANDIN_KSI_H
#define KVPROBE_STANDIN_KSI_H

#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

typedef struct KsiDevice KsiDevice;
typedef struct KsiModel KsiModel;

const char *ksi_last_error(void);
int ksi_library_version(uint32_t *major, uint32_t *minor, uint32_t *revision);
size_t ksi_device_count(void);
int ksi_device_open(KsiDevice **out);
void ksi_device_close(KsiDevice *dev);
int ksi_model_open(const KsiDevice *dev, const char *hef_path, const char *group, KsiModel **out);
void ksi_model_close(KsiModel *model);
size_t ksi_model_io_count(const KsiModel *model, int is_output);
void ksi_model_io(const KsiModel *model, int is_output, size_t index, const char **name, size_t *elements,
                  size_t *device_bytes);
int ksi_model_run(KsiDevice *dev, const KsiModel *model, const uint8_t *const *in_data, const size_t *in_lens,
                  const int32_t *in_types, uint8_t *const *out_data, const size_t *out_lens,
                  const int32_t *out_types, uint32_t timeout_ms);
int ksi_init_cache(KsiDevice *dev, uint32_t read_offset);
int ksi_update_cache_offset(KsiDevice *dev, int32_t delta);
int ksi_cache_list(KsiDevice *dev, uint32_t *ids, size_t *sizes, size_t *count);
int ksi_cache_read(KsiDevice *dev, uint32_t id, uint8_t *data, size_t len);
int ksi_cache_write(KsiDevice *dev, uint32_t id, const uint8_t *data, size_t len);

#ifdef __cplusplus
}
#endif

#endif
