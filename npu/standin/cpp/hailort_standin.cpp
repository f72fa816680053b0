// The C++ front of the test stand-in libhailort.so: implements kvprobe's HailoRT header subset
// (npu/standin/include/hailo) over the emulator's C ABI (ksi.h). It keeps what HailoRT keeps on
// the host side (stream formats, bindings, buffer sizes, configure order) and checks it the way
// the contract says HailoRT does; everything about the device is the emulator's.

#include "hailo/hailort.hpp"
#include "ksi.h"

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <exception>

// The Rust side answers with these literal values (npu/standin/src/status.rs).
static_assert(HAILO_SUCCESS == 0 && HAILO_INVALID_ARGUMENT == 2 && HAILO_TIMEOUT == 4, "status values");
static_assert(HAILO_INSUFFICIENT_BUFFER == 5 && HAILO_INVALID_OPERATION == 6, "status values");
static_assert(HAILO_INTERNAL_FAILURE == 8 && HAILO_OPEN_FILE_FAILURE == 13 && HAILO_INVALID_HEF == 26,
              "status values");
static_assert(HAILO_NOT_FOUND == 61 && HAILO_OUT_OF_PHYSICAL_DEVICES == 74 &&
                  HAILO_HEF_NOT_COMPATIBLE_WITH_DEVICE == 93,
              "status values");
static_assert(HAILO_FORMAT_TYPE_UINT8 == 1 && HAILO_FORMAT_TYPE_UINT16 == 2 && HAILO_FORMAT_TYPE_FLOAT32 == 3,
              "format values");

namespace {

// HailoRT writes its reasons to a log file, not to the caller's stderr; the stand-in appends its
// reasons to $KVPROBE_STANDIN_LOG when that is set.
hailo_status logged(int status, const char *what) {
    if (status != HAILO_SUCCESS) {
        const char *path = std::getenv("KVPROBE_STANDIN_LOG");
        if (path && *path) {
            if (FILE *f = std::fopen(path, "a")) {
                std::fprintf(f, "[stand-in] %s: status %d: %s\n", what, status, ksi_last_error());
                std::fclose(f);
            }
        }
    }
    return static_cast<hailo_status>(status);
}

int32_t type_for_bytes(size_t bytes) {
    switch (bytes) {
    case 2: return HAILO_FORMAT_TYPE_UINT16;
    case 4: return HAILO_FORMAT_TYPE_FLOAT32;
    default: return HAILO_FORMAT_TYPE_UINT8;
    }
}

size_t bytes_for_type(int32_t type) {
    switch (type) {
    case HAILO_FORMAT_TYPE_UINT16: return 2;
    case HAILO_FORMAT_TYPE_FLOAT32: return 4;
    default: return 1;
    }
}

}  // namespace

namespace hailort {

struct VDevice::Impl {
    KsiDevice *dev = nullptr;
    // Infer models with the KV-cache enabled that are not configured yet: cache calls fail until
    // every such core op is wired (contract §1.6, "CacheManager not initialized").
    int unwired_kv_models = 0;
    ~Impl() { ksi_device_close(dev); }
};

struct InferModel::InferStream::Impl {
    std::string name;
    size_t elements = 0;
    size_t device_bytes = 1;
    int32_t type = HAILO_FORMAT_TYPE_AUTO;
    int32_t host_type() const { return type == HAILO_FORMAT_TYPE_AUTO ? type_for_bytes(device_bytes) : type; }
    size_t frame_size() const { return elements * bytes_for_type(host_type()); }
};

struct InferModel::Impl {
    std::shared_ptr<VDevice::Impl> dev;
    KsiModel *model = nullptr;
    bool kv_cache = false;
    bool configured = false;
    std::vector<std::shared_ptr<InferStream::Impl>> inputs;
    std::vector<std::shared_ptr<InferStream::Impl>> outputs;
    ~Impl() {
        if (kv_cache && !configured) dev->unwired_kv_models--;
        ksi_model_close(model);
    }
};

struct ConfiguredInferModel::Bindings::InferStream::Impl {
    size_t frame_size = 0;
    MemoryView view;
    bool set = false;
};

struct ConfiguredInferModel::Bindings::Impl {
    std::map<std::string, std::shared_ptr<InferStream::Impl>> inputs;
    std::map<std::string, std::shared_ptr<InferStream::Impl>> outputs;
};

struct ConfiguredInferModel::Impl {
    std::shared_ptr<InferModel::Impl> model;
    // Host formats as of configure(): later set_format_type calls do not reach a configured model.
    std::vector<int32_t> in_types, out_types;
    std::vector<size_t> in_sizes, out_sizes;
    bool shut_down = false;
};

// ---- VDevice

Expected<std::unique_ptr<VDevice>> VDevice::create() {
    auto impl = std::make_shared<Impl>();
    int status = ksi_device_open(&impl->dev);
    if (status != HAILO_SUCCESS) return logged(status, "VDevice::create");
    return std::unique_ptr<VDevice>(new VDevice(impl));
}

Expected<std::shared_ptr<VDevice>> VDevice::create_shared() {
    auto v = create();
    if (!v) return v.status();
    return std::shared_ptr<VDevice>(v.release());
}

Expected<std::shared_ptr<InferModel>> VDevice::create_infer_model(const std::string &hef_path,
                                                                  const std::string &name) {
    auto impl = std::make_shared<InferModel::Impl>();
    impl->dev = m_impl;
    int status = ksi_model_open(m_impl->dev, hef_path.c_str(), name.c_str(), &impl->model);
    if (status != HAILO_SUCCESS) return logged(status, "create_infer_model");
    for (int is_output = 0; is_output < 2; is_output++) {
        size_t n = ksi_model_io_count(impl->model, is_output);
        for (size_t i = 0; i < n; i++) {
            auto s = std::make_shared<InferModel::InferStream::Impl>();
            const char *stream_name = nullptr;
            ksi_model_io(impl->model, is_output, i, &stream_name, &s->elements, &s->device_bytes);
            s->name = stream_name;
            (is_output ? impl->outputs : impl->inputs).push_back(s);
        }
    }
    try {
        return std::make_shared<InferModel>(impl);
    } catch (const std::exception &) {
        return HAILO_OUT_OF_HOST_MEMORY;
    }
}

// ---- InferModel

InferModel::InferModel(std::shared_ptr<Impl> impl) : m_impl(std::move(impl)) {
    for (auto &s : m_impl->inputs) {
        m_inputs.emplace_back(s);
        m_input_names.push_back(s->name);
    }
    for (auto &s : m_impl->outputs) {
        m_outputs.emplace_back(s);
        m_output_names.push_back(s->name);
    }
}

const std::string InferModel::InferStream::name() const { return m_impl->name; }
size_t InferModel::InferStream::get_frame_size() const { return m_impl->frame_size(); }
void InferModel::InferStream::set_format_type(hailo_format_type_t type) { m_impl->type = type; }

const std::vector<InferModel::InferStream> &InferModel::inputs() const { return m_inputs; }
const std::vector<InferModel::InferStream> &InferModel::outputs() const { return m_outputs; }
const std::vector<std::string> &InferModel::get_input_names() const { return m_input_names; }
const std::vector<std::string> &InferModel::get_output_names() const { return m_output_names; }

static Expected<InferModel::InferStream> find_stream(const std::vector<std::string> &names,
                                                     const std::vector<InferModel::InferStream> &streams,
                                                     const std::string &name) {
    if (name.empty() && streams.size() == 1) return streams[0];
    for (size_t i = 0; i < names.size(); i++) {
        if (names[i] == name) return streams[i];
    }
    return HAILO_NOT_FOUND;
}

Expected<InferModel::InferStream> InferModel::input(const std::string &name) {
    return find_stream(m_input_names, m_inputs, name);
}

Expected<InferModel::InferStream> InferModel::output(const std::string &name) {
    return find_stream(m_output_names, m_outputs, name);
}

void InferModel::set_enable_kv_cache(bool enable_kv_cache) {
    if (m_impl->configured || enable_kv_cache == m_impl->kv_cache) return;
    m_impl->kv_cache = enable_kv_cache;
    m_impl->dev->unwired_kv_models += enable_kv_cache ? 1 : -1;
}

Expected<ConfiguredInferModel> InferModel::configure() {
    if (m_impl->configured) return HAILO_INVALID_OPERATION;
    auto impl = std::make_shared<ConfiguredInferModel::Impl>();
    impl->model = m_impl;
    for (auto &s : m_impl->inputs) {
        impl->in_types.push_back(s->host_type());
        impl->in_sizes.push_back(s->frame_size());
    }
    for (auto &s : m_impl->outputs) {
        impl->out_types.push_back(s->host_type());
        impl->out_sizes.push_back(s->frame_size());
    }
    m_impl->configured = true;
    if (m_impl->kv_cache) m_impl->dev->unwired_kv_models--;
    return ConfiguredInferModel(impl);
}

// ---- ConfiguredInferModel

Expected<ConfiguredInferModel::Bindings> ConfiguredInferModel::create_bindings() {
    if (!m_impl) return HAILO_INVALID_OPERATION;
    auto b = std::make_shared<Bindings::Impl>();
    const auto &model = *m_impl->model;
    for (size_t i = 0; i < model.inputs.size(); i++) {
        auto s = std::make_shared<Bindings::InferStream::Impl>();
        s->frame_size = m_impl->in_sizes[i];
        b->inputs[model.inputs[i]->name] = s;
    }
    for (size_t i = 0; i < model.outputs.size(); i++) {
        auto s = std::make_shared<Bindings::InferStream::Impl>();
        s->frame_size = m_impl->out_sizes[i];
        b->outputs[model.outputs[i]->name] = s;
    }
    return Bindings(b);
}

static Expected<ConfiguredInferModel::Bindings::InferStream>
find_binding(const std::map<std::string, std::shared_ptr<ConfiguredInferModel::Bindings::InferStream::Impl>> &m,
             const std::string &name) {
    if (name.empty() && m.size() == 1) return ConfiguredInferModel::Bindings::InferStream(m.begin()->second);
    auto it = m.find(name);
    if (it == m.end()) return HAILO_NOT_FOUND;
    return ConfiguredInferModel::Bindings::InferStream(it->second);
}

Expected<ConfiguredInferModel::Bindings::InferStream> ConfiguredInferModel::Bindings::input(const std::string &name) {
    if (!m_impl) return HAILO_INVALID_OPERATION;
    return find_binding(m_impl->inputs, name);
}

Expected<ConfiguredInferModel::Bindings::InferStream> ConfiguredInferModel::Bindings::output(const std::string &name) {
    if (!m_impl) return HAILO_INVALID_OPERATION;
    return find_binding(m_impl->outputs, name);
}

hailo_status ConfiguredInferModel::Bindings::InferStream::set_buffer(MemoryView view) {
    if (!m_impl) return HAILO_INVALID_OPERATION;
    m_impl->view = view;
    m_impl->set = true;
    return HAILO_SUCCESS;
}

Expected<MemoryView> ConfiguredInferModel::Bindings::InferStream::get_buffer() const {
    if (!m_impl || !m_impl->set) return HAILO_INVALID_OPERATION;
    return m_impl->view;
}

hailo_status ConfiguredInferModel::run(Bindings bindings, std::chrono::milliseconds timeout) {
    if (!m_impl || m_impl->shut_down || !bindings.m_impl) return HAILO_INVALID_OPERATION;
    const auto &model = *m_impl->model;
    std::vector<const uint8_t *> in_data;
    std::vector<size_t> in_lens;
    std::vector<uint8_t *> out_data;
    std::vector<size_t> out_lens;
    // Every stream must be bound to a buffer of exactly its frame size.
    for (auto &s : model.inputs) {
        auto &b = *bindings.m_impl->inputs.at(s->name);
        if (!b.set) return HAILO_INVALID_OPERATION;
        if (b.view.size() != b.frame_size) return HAILO_INVALID_ARGUMENT;
        in_data.push_back(b.view.data());
        in_lens.push_back(b.view.size());
    }
    for (auto &s : model.outputs) {
        auto &b = *bindings.m_impl->outputs.at(s->name);
        if (!b.set) return HAILO_INVALID_OPERATION;
        if (b.view.size() != b.frame_size) return HAILO_INVALID_ARGUMENT;
        out_data.push_back(b.view.data());
        out_lens.push_back(b.view.size());
    }
    auto ms = timeout.count() < 0 ? 0 : static_cast<uint64_t>(timeout.count());
    return logged(ksi_model_run(model.dev->dev, model.model, in_data.data(), in_lens.data(),
                                m_impl->in_types.data(), out_data.data(), out_lens.data(),
                                m_impl->out_types.data(), static_cast<uint32_t>(ms > UINT32_MAX ? UINT32_MAX : ms)),
                  "run");
}

hailo_status ConfiguredInferModel::shutdown() {
    if (m_impl) m_impl->shut_down = true;
    return HAILO_SUCCESS;
}

// Cache calls: only on a configured model with the KV-cache enabled, once every KV model on the
// device is wired (contract §1.6).
static hailo_status cache_ready(const std::shared_ptr<ConfiguredInferModel::Impl> &impl) {
    if (!impl || impl->shut_down || !impl->model->kv_cache) return HAILO_INVALID_OPERATION;
    if (impl->model->dev->unwired_kv_models > 0) return HAILO_INVALID_OPERATION;
    return HAILO_SUCCESS;
}

hailo_status ConfiguredInferModel::init_cache(uint32_t read_offset) {
    auto status = cache_ready(m_impl);
    if (status != HAILO_SUCCESS) return status;
    return logged(ksi_init_cache(m_impl->model->dev->dev, read_offset), "init_cache");
}

hailo_status ConfiguredInferModel::update_cache_offset(int32_t offset_delta_entries) {
    auto status = cache_ready(m_impl);
    if (status != HAILO_SUCCESS) return status;
    return logged(ksi_update_cache_offset(m_impl->model->dev->dev, offset_delta_entries), "update_cache_offset");
}

Expected<std::unordered_map<uint32_t, BufferPtr>> ConfiguredInferModel::get_cache_buffers() {
    auto status = cache_ready(m_impl);
    if (status != HAILO_SUCCESS) return status;
    KsiDevice *dev = m_impl->model->dev->dev;
    size_t count = 0;
    int s = ksi_cache_list(dev, nullptr, nullptr, &count);
    if (s != HAILO_SUCCESS) return logged(s, "get_cache_buffers");
    std::vector<uint32_t> ids(count);
    std::vector<size_t> sizes(count);
    s = ksi_cache_list(dev, ids.data(), sizes.data(), &count);
    if (s != HAILO_SUCCESS) return logged(s, "get_cache_buffers");
    std::unordered_map<uint32_t, BufferPtr> out;
    for (size_t i = 0; i < count; i++) {
        auto buf = std::make_shared<Buffer>(std::vector<uint8_t>(sizes[i]));
        s = ksi_cache_read(dev, ids[i], buf->data(), buf->size());
        if (s != HAILO_SUCCESS) return logged(s, "get_cache_buffers");
        out.emplace(ids[i], buf);
    }
    return out;
}

hailo_status ConfiguredInferModel::update_cache_buffer(uint32_t cache_id, MemoryView buffer) {
    auto status = cache_ready(m_impl);
    if (status != HAILO_SUCCESS) return status;
    return logged(ksi_cache_write(m_impl->model->dev->dev, cache_id, buffer.data(), buffer.size()),
                  "update_cache_buffer");
}

}  // namespace hailort

// ---- C API

extern "C" {

hailo_status hailo_get_library_version(hailo_version_t *version) {
    if (!version) return HAILO_INVALID_ARGUMENT;
    return logged(ksi_library_version(&version->major, &version->minor, &version->revision),
                  "hailo_get_library_version");
}

const char *hailo_get_status_message(hailo_status status) {
    return status == HAILO_SUCCESS ? "Success" : "see hailo_status";
}

hailo_status hailo_scan_devices(hailo_scan_devices_params_t *params, hailo_device_id_t *device_ids,
                                size_t *device_ids_length) {
    (void)params;
    if (!device_ids || !device_ids_length) return HAILO_INVALID_ARGUMENT;
    size_t n = ksi_device_count();
    if (*device_ids_length < n) {
        *device_ids_length = n;
        return HAILO_INSUFFICIENT_BUFFER;
    }
    for (size_t i = 0; i < n; i++) {
        std::memset(device_ids[i].id, 0, sizeof(device_ids[i].id));
        std::snprintf(device_ids[i].id, sizeof(device_ids[i].id), "kvprobe-standin-%u", static_cast<unsigned>(i % 1000));
    }
    *device_ids_length = n;
    return HAILO_SUCCESS;
}

// One static token stands for an opened device: the stand-in has one emulated device and no
// per-handle state, so identify only checks that the handle came from create.
struct _hailo_device {
    int unused;
};
static _hailo_device g_device_handle;

hailo_status hailo_create_device_by_id(const hailo_device_id_t *device_id, hailo_device *device) {
    if (!device_id || !device) return HAILO_INVALID_ARGUMENT;
    if (ksi_device_count() == 0) return logged(HAILO_NOT_FOUND, "hailo_create_device_by_id");
    *device = &g_device_handle;
    return HAILO_SUCCESS;
}

hailo_status hailo_identify(hailo_device device, hailo_device_identity_t *identity) {
    if (device != &g_device_handle || !identity) return HAILO_INVALID_ARGUMENT;
    std::memset(identity, 0, sizeof(*identity));
    uint32_t major = 0, minor = 0, rev = 0;
    // The stand-in's firmware is its library: the same version, marked by the board name.
    int s = ksi_library_version(&major, &minor, &rev);
    if (s != HAILO_SUCCESS) return logged(s, "hailo_identify");
    identity->fw_version = {major, minor, rev};
    identity->is_release = true;
    identity->device_architecture = HAILO_ARCH_HAILO10H;
    const char board[] = "kvprobe-standin";
    identity->board_name_length = sizeof(board) - 1;
    std::memcpy(identity->board_name, board, sizeof(board) - 1);
    const char serial[] = "STANDIN0001";
    identity->serial_number_length = sizeof(serial) - 1;
    std::memcpy(identity->serial_number, serial, sizeof(serial) - 1);
    return HAILO_SUCCESS;
}

hailo_status hailo_release_device(hailo_device device) {
    return device == &g_device_handle ? HAILO_SUCCESS : HAILO_INVALID_ARGUMENT;
}

}  // extern "C"
