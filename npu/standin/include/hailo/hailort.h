/* kvprobe's own subset of the HailoRT C API (hailort.h): only what kvprobe's shim and the
 * hailort-sys crate use, written from kvprobe's contract notes (docs/hardware.md). It is not
 * HailoRT's header; it declares the same names, types and values so that the shim compiles
 * unchanged against either. Implemented by the test stand-in (npu/standin). */
#ifndef KVPROBE_STANDIN_HAILORT_H
#define KVPROBE_STANDIN_HAILORT_H

#include <stddef.h>
#include <stdbool.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#define HAILO_MAX_DEVICE_ID_LENGTH (32)
#define HAILO_MAX_BOARD_NAME_LENGTH (32)
#define HAILO_MAX_SERIAL_NUMBER_LENGTH (16)
#define HAILO_MAX_PART_NUMBER_LENGTH (16)
#define HAILO_MAX_PRODUCT_NAME_LENGTH (42)

typedef enum hailo_status {
    HAILO_SUCCESS = 0,
    HAILO_UNINITIALIZED = 1,
    HAILO_INVALID_ARGUMENT = 2,
    HAILO_OUT_OF_HOST_MEMORY = 3,
    HAILO_TIMEOUT = 4,
    HAILO_INSUFFICIENT_BUFFER = 5,
    HAILO_INVALID_OPERATION = 6,
    HAILO_NOT_IMPLEMENTED = 7,
    HAILO_INTERNAL_FAILURE = 8,
    HAILO_DATA_ALIGNMENT_FAILURE = 9,
    HAILO_CHUNK_TOO_LARGE = 10,
    HAILO_INVALID_LOGGER_LEVEL = 11,
    HAILO_CLOSE_FAILURE = 12,
    HAILO_OPEN_FILE_FAILURE = 13,
    HAILO_FILE_OPERATION_FAILURE = 14,
    HAILO_UNSUPPORTED_CONTROL_PROTOCOL_VERSION = 15,
    HAILO_UNSUPPORTED_FW_VERSION = 16,
    HAILO_INVALID_CONTROL_RESPONSE = 17,
    HAILO_FW_CONTROL_FAILURE = 18,
    HAILO_ETH_FAILURE = 19,
    HAILO_ETH_INTERFACE_NOT_FOUND = 20,
    HAILO_ETH_RECV_FAILURE = 21,
    HAILO_ETH_SEND_FAILURE = 22,
    HAILO_INVALID_FIRMWARE = 23,
    HAILO_INVALID_CONTEXT_COUNT = 24,
    HAILO_INVALID_FRAME = 25,
    HAILO_INVALID_HEF = 26,
    HAILO_PCIE_NOT_SUPPORTED_ON_PLATFORM = 27,
    HAILO_INTERRUPTED_BY_SIGNAL = 28,
    HAILO_START_VDMA_CHANNEL_FAIL = 29,
    HAILO_SYNC_VDMA_BUFFER_FAIL = 30,
    HAILO_STOP_VDMA_CHANNEL_FAIL = 31,
    HAILO_CLOSE_VDMA_CHANNEL_FAIL = 32,
    HAILO_ATR_TABLES_CONF_VALIDATION_FAIL = 33,
    HAILO_EVENT_CREATE_FAIL = 34,
    HAILO_READ_EVENT_FAIL = 35,
    HAILO_DRIVER_OPERATION_FAILED = 36,
    HAILO_INVALID_FIRMWARE_MAGIC = 37,
    HAILO_INVALID_FIRMWARE_CODE_SIZE = 38,
    HAILO_INVALID_KEY_CERTIFICATE_SIZE = 39,
    HAILO_INVALID_CONTENT_CERTIFICATE_SIZE = 40,
    HAILO_MISMATCHING_FIRMWARE_BUFFER_SIZES = 41,
    HAILO_INVALID_FIRMWARE_CPU_ID = 42,
    HAILO_CONTROL_RESPONSE_MD5_MISMATCH = 43,
    HAILO_GET_CONTROL_RESPONSE_FAIL = 44,
    HAILO_GET_D2H_EVENT_MESSAGE_FAIL = 45,
    HAILO_MUTEX_INIT_FAIL = 46,
    HAILO_OUT_OF_DESCRIPTORS = 47,
    HAILO_UNSUPPORTED_OPCODE = 48,
    HAILO_USER_MODE_RATE_LIMITER_NOT_SUPPORTED = 49,
    HAILO_RATE_LIMIT_MAXIMUM_BANDWIDTH_EXCEEDED = 50,
    HAILO_ANSI_TO_UTF16_CONVERSION_FAILED = 51,
    HAILO_UTF16_TO_ANSI_CONVERSION_FAILED = 52,
    HAILO_UNEXPECTED_INTERFACE_INFO_FAILURE = 53,
    HAILO_UNEXPECTED_ARP_TABLE_FAILURE = 54,
    HAILO_MAC_ADDRESS_NOT_FOUND = 55,
    HAILO_NO_IPV4_INTERFACES_FOUND = 56,
    HAILO_SHUTDOWN_EVENT_SIGNALED = 57,
    HAILO_THREAD_ALREADY_ACTIVATED = 58,
    HAILO_THREAD_NOT_ACTIVATED = 59,
    HAILO_THREAD_NOT_JOINABLE = 60,
    HAILO_NOT_FOUND = 61,
    HAILO_COMMUNICATION_CLOSED = 62,
    HAILO_STREAM_ABORT = 63,
    HAILO_DRIVER_NOT_INSTALLED = 64,
    HAILO_NOT_AVAILABLE = 65,
    HAILO_TRAFFIC_CONTROL_FAILURE = 66,
    HAILO_INVALID_SECOND_STAGE = 67,
    HAILO_INVALID_PIPELINE = 68,
    HAILO_NETWORK_GROUP_NOT_ACTIVATED = 69,
    HAILO_VSTREAM_PIPELINE_NOT_ACTIVATED = 70,
    HAILO_OUT_OF_FW_MEMORY = 71,
    HAILO_STREAM_NOT_ACTIVATED = 72,
    HAILO_DEVICE_IN_USE = 73,
    HAILO_OUT_OF_PHYSICAL_DEVICES = 74,
    HAILO_INVALID_DEVICE_ARCHITECTURE = 75,
    HAILO_INVALID_DRIVER_VERSION = 76,
    HAILO_RPC_FAILED = 77,
    HAILO_INVALID_SERVICE_VERSION = 78,
    HAILO_NOT_SUPPORTED = 79,
    HAILO_NMS_BURST_INVALID_DATA = 80,
    HAILO_OUT_OF_HOST_CMA_MEMORY = 81,
    HAILO_QUEUE_IS_FULL = 82,
    HAILO_DMA_MAPPING_ALREADY_EXISTS = 83,
    HAILO_CANT_MEET_BUFFER_REQUIREMENTS = 84,
    HAILO_DRIVER_INVALID_RESPONSE = 85,
    HAILO_DRIVER_INVALID_IOCTL = 86,
    HAILO_DRIVER_TIMEOUT = 87,
    HAILO_DRIVER_INTERRUPTED = 88,
    HAILO_CONNECTION_REFUSED = 89,
    HAILO_DRIVER_WAIT_CANCELED = 90,
    HAILO_HEF_FILE_CORRUPTED = 91,
    HAILO_HEF_NOT_SUPPORTED = 92,
    HAILO_HEF_NOT_COMPATIBLE_WITH_DEVICE = 93,
    HAILO_INVALID_HEF_USE = 94,
    HAILO_OPERATION_ABORTED = 95,
    HAILO_DEVICE_NOT_CONNECTED = 96,
    HAILO_DEVICE_TEMPORARILY_UNAVAILABLE = 97,
    HAILO_STATUS_MAX_ENUM = 0x7FFFFFFF
} hailo_status;

typedef enum hailo_format_type_e {
    HAILO_FORMAT_TYPE_AUTO = 0,
    HAILO_FORMAT_TYPE_UINT8 = 1,
    HAILO_FORMAT_TYPE_UINT16 = 2,
    HAILO_FORMAT_TYPE_FLOAT32 = 3,
    HAILO_FORMAT_TYPE_MAX_ENUM = 0x7FFFFFFF
} hailo_format_type_t;

typedef struct {
    uint32_t major;
    uint32_t minor;
    uint32_t revision;
} hailo_version_t;

typedef struct {
    char id[HAILO_MAX_DEVICE_ID_LENGTH];
} hailo_device_id_t;

/* Opaque here: kvprobe passes NULL (the defaults). */
typedef struct _hailo_scan_devices_params_t hailo_scan_devices_params_t;

/* Device identification, the C API's layout (hailort-sys checks the same offsets). */
typedef struct _hailo_device *hailo_device;

typedef struct {
    uint32_t major;
    uint32_t minor;
    uint32_t revision;
} hailo_firmware_version_t;

typedef enum hailo_device_architecture_e {
    HAILO_ARCH_HAILO8_A0 = 0,
    HAILO_ARCH_HAILO8,
    HAILO_ARCH_HAILO8L,
    HAILO_ARCH_HAILO15H,
    HAILO_ARCH_HAILO15L,
    HAILO_ARCH_HAILO15M,
    HAILO_ARCH_HAILO10H,
    HAILO_ARCH_HAILO12L,
    HAILO_ARCH_MAX_ENUM = 0x7FFFFFFF
} hailo_device_architecture_t;

typedef struct {
    uint32_t protocol_version;
    hailo_firmware_version_t fw_version;
    uint32_t logger_version;
    uint8_t board_name_length;
    char board_name[HAILO_MAX_BOARD_NAME_LENGTH];
    bool is_release;
    bool extended_context_switch_buffer;
    bool extended_fw_check;
    hailo_device_architecture_t device_architecture;
    uint8_t serial_number_length;
    char serial_number[HAILO_MAX_SERIAL_NUMBER_LENGTH];
    uint8_t part_number_length;
    char part_number[HAILO_MAX_PART_NUMBER_LENGTH];
    uint8_t product_name_length;
    char product_name[HAILO_MAX_PRODUCT_NAME_LENGTH];
} hailo_device_identity_t;

hailo_status hailo_create_device_by_id(const hailo_device_id_t *device_id, hailo_device *device);
hailo_status hailo_identify(hailo_device device, hailo_device_identity_t *device_identity);
hailo_status hailo_release_device(hailo_device device);

hailo_status hailo_get_library_version(hailo_version_t *version);
const char *hailo_get_status_message(hailo_status status);
hailo_status hailo_scan_devices(hailo_scan_devices_params_t *params, hailo_device_id_t *device_ids,
                                size_t *device_ids_length);

#ifdef __cplusplus
}
#endif

#endif
