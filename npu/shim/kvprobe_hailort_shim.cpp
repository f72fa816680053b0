// Thin C ABI over HailoRT's C++ infer-model API (contract §6.3). Compiled by npu/build.rs only
// when hailo/hailort.h is found. No logic lives here beyond what the ABI needs: the ring
// arithmetic, quantisation and checks are in Rust.

#include "kvprobe_hailort_shim.h"

#include "hailo/hailort.hpp"

#include <algorithm>
#include <chrono>
#include <cstdlib>
#include <cstring>
#include <exception>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <utility>
#include <vector>

using namespace hailort;

namespace {

thread_local std::string g_last_error;

int fail(hailo_status status, const std::string &what) {
    g_last_error = what;
    return static_cast<int>(status);
}

int ok() {
    g_last_error.clear();
    return HAILO_SUCCESS;
}

// Some HailoRT versions return void from setters, others a hailo_status: accept both.
template <typename F>
hailo_status call_status(F &&f) {
    if constexpr (std::is_void_v<decltype(f())>) {
        f();
        return HAILO_SUCCESS;
    } else {
        return static_cast<hailo_status>(f());
    }
}

struct AlignedBuffer {
    uint8_t *ptr = nullptr;
    size_t size = 0;
    explicit AlignedBuffer(size_t n) : size(n) {
        // HailoRT asks for page-aligned buffers whose allocation is a whole number of pages.
        const size_t page = 4096;
        size_t alloc = ((n + page - 1) / page) * page;
        if (alloc == 0) alloc = page;
        ptr = static_cast<uint8_t *>(std::aligned_alloc(page, alloc));
        if (ptr) std::memset(ptr, 0, alloc);
    }
    ~AlignedBuffer() { std::free(ptr); }
    AlignedBuffer(const AlignedBuffer &) = delete;
    AlignedBuffer &operator=(const AlignedBuffer &) = delete;
};

}  // namespace

struct kvp_vdevice {
    std::shared_ptr<VDevice> vdevice;
};

struct kvp_model {
    std::shared_ptr<VDevice> vdevice;  // keeps the device alive as long as the model
    std::shared_ptr<InferModel> infer_model;
    ConfiguredInferModel configured;
    ConfiguredInferModel::Bindings bindings;
    std::vector<std::string> input_names;
    std::vector<std::string> output_names;
    std::map<std::string, std::unique_ptr<AlignedBuffer>> inputs;
    std::map<std::string, std::unique_ptr<AlignedBuffer>> outputs;
    std::vector<std::pair<uint32_t, BufferPtr>> cache_snapshot;
};

extern "C" {

const char *kvp_last_error(void) { return g_last_error.c_str(); }

int kvp_vdevice_create(kvp_vdevice **out) {
    try {
        auto vdevice = VDevice::create();
        if (!vdevice) return fail(vdevice.status(), "VDevice::create");
        auto *h = new kvp_vdevice();
        h->vdevice = std::shared_ptr<VDevice>(vdevice.release());
        *out = h;
        return ok();
    } catch (const std::exception &e) {
        return fail(HAILO_INTERNAL_FAILURE, std::string("VDevice::create threw: ") + e.what());
    }
}

void kvp_vdevice_release(kvp_vdevice *vdevice) { delete vdevice; }

int kvp_model_create(kvp_vdevice *vdevice, const char *hef_path, const char *group_name,
                     const char *const *float_inputs, size_t n_float_inputs, kvp_model **out) {
    try {
        auto m = std::make_unique<kvp_model>();
        m->vdevice = vdevice->vdevice;
        auto im = m->vdevice->create_infer_model(std::string(hef_path), std::string(group_name));
        if (!im) return fail(im.status(), std::string("create_infer_model(") + group_name + ")");
        m->infer_model = im.release();
        auto status = call_status([&] { return m->infer_model->set_enable_kv_cache(true); });
        if (status != HAILO_SUCCESS) return fail(status, "set_enable_kv_cache(true)");
        for (size_t i = 0; i < n_float_inputs; i++) {
            auto in = m->infer_model->input(std::string(float_inputs[i]));
            if (!in) return fail(in.status(), std::string("input(") + float_inputs[i] + ")");
            status = call_status([&] { return in->set_format_type(HAILO_FORMAT_TYPE_FLOAT32); });
            if (status != HAILO_SUCCESS) return fail(status, "set_format_type(FLOAT32) on an input");
        }
        for (auto &o : m->infer_model->outputs()) {
            auto stream = o;
            status = call_status([&] { return stream.set_format_type(HAILO_FORMAT_TYPE_FLOAT32); });
            if (status != HAILO_SUCCESS) return fail(status, "set_format_type(FLOAT32) on an output");
        }
        auto configured = m->infer_model->configure();
        if (!configured) return fail(configured.status(), std::string("configure(") + group_name + ")");
        m->configured = configured.release();
        auto bindings = m->configured.create_bindings();
        if (!bindings) return fail(bindings.status(), "create_bindings");
        m->bindings = bindings.release();
        for (auto &in : m->infer_model->inputs()) {
            const std::string name = in.name();
            auto buf = std::make_unique<AlignedBuffer>(in.get_frame_size());
            if (!buf->ptr) return fail(HAILO_OUT_OF_HOST_MEMORY, "input buffer allocation");
            auto b = m->bindings.input(name);
            if (!b) return fail(b.status(), "bindings.input(" + name + ")");
            status = b->set_buffer(MemoryView(buf->ptr, buf->size));
            if (status != HAILO_SUCCESS) return fail(status, "set_buffer(" + name + ")");
            m->input_names.push_back(name);
            m->inputs[name] = std::move(buf);
        }
        for (auto &o : m->infer_model->outputs()) {
            const std::string name = o.name();
            auto buf = std::make_unique<AlignedBuffer>(o.get_frame_size());
            if (!buf->ptr) return fail(HAILO_OUT_OF_HOST_MEMORY, "output buffer allocation");
            auto b = m->bindings.output(name);
            if (!b) return fail(b.status(), "bindings.output(" + name + ")");
            status = b->set_buffer(MemoryView(buf->ptr, buf->size));
            if (status != HAILO_SUCCESS) return fail(status, "set_buffer(" + name + ")");
            m->output_names.push_back(name);
            m->outputs[name] = std::move(buf);
        }
        *out = m.release();
        return ok();
    } catch (const std::exception &e) {
        return fail(HAILO_INTERNAL_FAILURE, std::string("model creation threw: ") + e.what());
    }
}

void kvp_model_release(kvp_model *model) {
    if (model) {
        model->configured.shutdown();
        delete model;
    }
}

size_t kvp_model_io_count(const kvp_model *model, int is_output) {
    return is_output ? model->output_names.size() : model->input_names.size();
}

int kvp_model_io_name(const kvp_model *model, int is_output, size_t index, char *buf, size_t buf_len) {
    const auto &names = is_output ? model->output_names : model->input_names;
    if (index >= names.size()) return fail(HAILO_INVALID_ARGUMENT, "io index out of range");
    const auto &n = names[index];
    if (buf_len < n.size() + 1) return fail(HAILO_INSUFFICIENT_BUFFER, "name buffer too small");
    std::memcpy(buf, n.c_str(), n.size() + 1);
    return ok();
}

int kvp_model_frame_size(const kvp_model *model, int is_output, const char *name, size_t *size) {
    const auto &m = is_output ? model->outputs : model->inputs;
    auto it = m.find(name);
    if (it == m.end()) return fail(HAILO_NOT_FOUND, std::string("no stream named ") + name);
    *size = it->second->size;
    return ok();
}

// Streams are looked up through HailoRT's bindings, so an unknown name is HailoRT's
// HAILO_NOT_FOUND and a wrong size is checked against the buffer bound to the stream.
static int bound_buffer(kvp_model *model, bool is_output, const char *name, size_t len, uint8_t **ptr) {
    auto b = is_output ? model->bindings.output(name) : model->bindings.input(name);
    if (!b) return fail(b.status(), std::string(is_output ? "bindings.output(" : "bindings.input(") + name + ")");
    auto view = b->get_buffer();
    if (!view) return fail(view.status(), std::string("get_buffer(") + name + ")");
    if (len != view->size())
        return fail(HAILO_INVALID_ARGUMENT, std::string("wrong frame size for ") + name + ": " + std::to_string(len) +
                                                " bytes, frame is " + std::to_string(view->size()));
    *ptr = static_cast<uint8_t *>(view->data());
    return HAILO_SUCCESS;
}

int kvp_model_set_input(kvp_model *model, const char *name, const void *data, size_t len) {
    try {
        uint8_t *dst = nullptr;
        int status = bound_buffer(model, false, name, len, &dst);
        if (status != HAILO_SUCCESS) return status;
        std::memcpy(dst, data, len);
        return ok();
    } catch (const std::exception &e) {
        return fail(HAILO_INTERNAL_FAILURE, std::string("set input threw: ") + e.what());
    }
}

int kvp_model_run(kvp_model *model, uint32_t timeout_ms) {
    try {
        auto status = model->configured.run(model->bindings, std::chrono::milliseconds(timeout_ms));
        if (status != HAILO_SUCCESS) return fail(status, "run");
        return ok();
    } catch (const std::exception &e) {
        return fail(HAILO_INTERNAL_FAILURE, std::string("run threw: ") + e.what());
    }
}

int kvp_model_get_output(const kvp_model *model, const char *name, void *data, size_t len) {
    try {
        uint8_t *src = nullptr;
        int status = bound_buffer(const_cast<kvp_model *>(model), true, name, len, &src);
        if (status != HAILO_SUCCESS) return status;
        std::memcpy(data, src, len);
        return ok();
    } catch (const std::exception &e) {
        return fail(HAILO_INTERNAL_FAILURE, std::string("get output threw: ") + e.what());
    }
}

int kvp_model_init_cache(kvp_model *model, uint32_t read_offset) {
    auto status = model->configured.init_cache(read_offset);
    return status == HAILO_SUCCESS ? ok() : fail(status, "init_cache");
}

int kvp_model_update_cache_offset(kvp_model *model, int32_t delta_entries) {
    auto status = model->configured.update_cache_offset(delta_entries);
    return status == HAILO_SUCCESS ? ok() : fail(status, "update_cache_offset");
}

int kvp_model_fetch_cache_buffers(kvp_model *model, size_t *count) {
    try {
        auto buffers = model->configured.get_cache_buffers();
        if (!buffers) return fail(buffers.status(), "get_cache_buffers");
        model->cache_snapshot.clear();
        for (auto &kv : buffers.value()) model->cache_snapshot.emplace_back(kv.first, kv.second);
        std::sort(model->cache_snapshot.begin(), model->cache_snapshot.end(),
                  [](const auto &a, const auto &b) { return a.first < b.first; });
        *count = model->cache_snapshot.size();
        return ok();
    } catch (const std::exception &e) {
        return fail(HAILO_INTERNAL_FAILURE, std::string("get_cache_buffers threw: ") + e.what());
    }
}

int kvp_model_cache_entry(const kvp_model *model, size_t index, uint32_t *cache_id, const uint8_t **data,
                          size_t *len) {
    if (index >= model->cache_snapshot.size()) return fail(HAILO_INVALID_ARGUMENT, "cache index out of range");
    const auto &e = model->cache_snapshot[index];
    *cache_id = e.first;
    *data = e.second->data();
    *len = e.second->size();
    return ok();
}

int kvp_model_update_cache_buffer(kvp_model *model, uint32_t cache_id, const void *data, size_t len) {
    auto status = model->configured.update_cache_buffer(
        cache_id, MemoryView(const_cast<void *>(data), len));
    return status == HAILO_SUCCESS ? ok() : fail(status, "update_cache_buffer");
}

}  // extern "C"
