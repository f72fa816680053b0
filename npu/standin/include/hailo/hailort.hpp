// kvprobe's own subset of the HailoRT C++ API (hailort.hpp): the classes and members kvprobe's
// shim calls (contract §6.1–§6.3), with the same namespace, names and signatures, so the shim
// compiles unchanged against HailoRT's headers or these. Not HailoRT's header: the private parts
// (one shared_ptr per object) are the test stand-in's (npu/standin).
#ifndef KVPROBE_STANDIN_HAILORT_HPP
#define KVPROBE_STANDIN_HAILORT_HPP

#include "hailo/hailort.h"

#include <chrono>
#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

namespace hailort {

// A value or the status that prevented it.
template <typename T>
class Expected {
public:
    Expected(T &&value) : m_status(HAILO_SUCCESS), m_value(std::move(value)), m_has(true) {}
    Expected(const T &value) : m_status(HAILO_SUCCESS), m_value(value), m_has(true) {}
    Expected(hailo_status status) : m_status(status), m_value(), m_has(false) {}

    bool has_value() const { return m_has; }
    explicit operator bool() const { return m_has; }
    hailo_status status() const { return m_status; }
    T &value() & { return m_value; }
    const T &value() const & { return m_value; }
    T release() { return std::move(m_value); }
    T *operator->() { return &m_value; }
    const T *operator->() const { return &m_value; }
    T &operator*() & { return m_value; }

private:
    hailo_status m_status;
    T m_value;
    bool m_has;
};

class MemoryView {
public:
    MemoryView() : m_data(nullptr), m_size(0) {}
    MemoryView(void *data, size_t size) : m_data(static_cast<uint8_t *>(data)), m_size(size) {}
    uint8_t *data() const { return m_data; }
    size_t size() const { return m_size; }
    bool empty() const { return m_size == 0; }

private:
    uint8_t *m_data;
    size_t m_size;
};

class Buffer {
public:
    Buffer() = default;
    explicit Buffer(std::vector<uint8_t> bytes) : m_bytes(std::move(bytes)) {}
    uint8_t *data() { return m_bytes.data(); }
    const uint8_t *data() const { return m_bytes.data(); }
    size_t size() const { return m_bytes.size(); }

private:
    std::vector<uint8_t> m_bytes;
};
using BufferPtr = std::shared_ptr<Buffer>;

class InferModel;

class ConfiguredInferModel {
public:
    class Bindings {
    public:
        class InferStream {
        public:
            struct Impl;
            explicit InferStream(std::shared_ptr<Impl> impl) : m_impl(std::move(impl)) {}
            InferStream() = default;
            hailo_status set_buffer(MemoryView view);
            Expected<MemoryView> get_buffer() const;

        private:
            std::shared_ptr<Impl> m_impl;
        };

        struct Impl;
        Bindings() = default;
        explicit Bindings(std::shared_ptr<Impl> impl) : m_impl(std::move(impl)) {}
        Expected<InferStream> input(const std::string &name = "");
        Expected<InferStream> output(const std::string &name = "");

    private:
        friend class ConfiguredInferModel;
        std::shared_ptr<Impl> m_impl;
    };

    struct Impl;
    ConfiguredInferModel() = default;
    explicit ConfiguredInferModel(std::shared_ptr<Impl> impl) : m_impl(std::move(impl)) {}

    Expected<Bindings> create_bindings();
    hailo_status run(Bindings bindings, std::chrono::milliseconds timeout);
    hailo_status shutdown();
    hailo_status init_cache(uint32_t read_offset);
    hailo_status update_cache_offset(int32_t offset_delta_entries);
    Expected<std::unordered_map<uint32_t, BufferPtr>> get_cache_buffers();
    hailo_status update_cache_buffer(uint32_t cache_id, MemoryView buffer);

private:
    std::shared_ptr<Impl> m_impl;
};

class InferModel {
public:
    class InferStream {
    public:
        struct Impl;
        explicit InferStream(std::shared_ptr<Impl> impl) : m_impl(std::move(impl)) {}
        InferStream() = default;
        const std::string name() const;
        size_t get_frame_size() const;
        void set_format_type(hailo_format_type_t type);

    private:
        std::shared_ptr<Impl> m_impl;
    };

    struct Impl;
    explicit InferModel(std::shared_ptr<Impl> impl);
    virtual ~InferModel() = default;
    InferModel(const InferModel &) = delete;
    InferModel &operator=(const InferModel &) = delete;

    const std::vector<InferStream> &inputs() const;
    const std::vector<InferStream> &outputs() const;
    Expected<InferStream> input(const std::string &name = "");
    Expected<InferStream> output(const std::string &name = "");
    const std::vector<std::string> &get_input_names() const;
    const std::vector<std::string> &get_output_names() const;
    void set_enable_kv_cache(bool enable_kv_cache);
    Expected<ConfiguredInferModel> configure();

private:
    std::shared_ptr<Impl> m_impl;
    std::vector<InferStream> m_inputs;
    std::vector<InferStream> m_outputs;
    std::vector<std::string> m_input_names;
    std::vector<std::string> m_output_names;
};

class VDevice {
public:
    struct Impl;
    static Expected<std::unique_ptr<VDevice>> create();
    static Expected<std::shared_ptr<VDevice>> create_shared();
    virtual ~VDevice() = default;
    VDevice(const VDevice &) = delete;
    VDevice &operator=(const VDevice &) = delete;

    virtual Expected<std::shared_ptr<InferModel>> create_infer_model(const std::string &hef_path,
                                                                     const std::string &name = "");

protected:
    explicit VDevice(std::shared_ptr<Impl> impl) : m_impl(std::move(impl)) {}

private:
    std::shared_ptr<Impl> m_impl;
};

}  // namespace hailort

#endif
