// spm_shim.cc: the C interface (spm.h) over libsentencepiece's C++ SentencePieceProcessor — load a
// .model file, encode to ids, decode ids, look pieces up and serialize. Nothing else of the library is
// used, and no C++ exception or object crosses into the C code.
#include <sentencepiece_processor.h>

#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <memory>
#include <new>
#include <string>
#include <vector>

#include "spm.h"

struct spm_model {
    sentencepiece::SentencePieceProcessor processor;
};

static void set_message(char *msg, size_t msg_size, const std::string &text) {
    if (msg_size) std::snprintf(msg, msg_size, "%s", text.c_str());
}

// The model is owned by a unique_ptr until it is handed out, so that an exception thrown while the
// library builds it (its tries throw on some malformed models) frees it too.
extern "C" spm_model *spm_shim_load(const char *path, char *msg, size_t msg_size) {
    try {
        std::unique_ptr<spm_model> m(new spm_model);
        const auto status = m->processor.Load(path);
        if (!status.ok()) {
            set_message(msg, msg_size, status.ToString());
            return nullptr;
        }
        return m.release();
    } catch (const std::exception &e) {
        set_message(msg, msg_size, e.what());
        return nullptr;
    } catch (...) {
        set_message(msg, msg_size, "the SentencePiece library failed with an unknown exception");
        return nullptr;
    }
}

extern "C" void spm_shim_free(spm_model *m) { delete m; }

extern "C" int32_t *spm_shim_encode(const spm_model *m, const char *text, size_t n, size_t *count, char *msg,
                                    size_t msg_size) {
    try {
        std::vector<int> ids;
        const auto status = m->processor.Encode(std::string(text, n), &ids);
        if (!status.ok()) {
            set_message(msg, msg_size, status.ToString());
            return nullptr;
        }
        int32_t *out = static_cast<int32_t *>(std::malloc((ids.size() + 1) * sizeof(int32_t)));
        if (!out) return nullptr;
        for (size_t i = 0; i < ids.size(); i++) out[i] = ids[i];
        *count = ids.size();
        return out;
    } catch (const std::exception &e) {
        set_message(msg, msg_size, e.what());
        return nullptr;
    }
}

extern "C" char *spm_shim_decode(const spm_model *m, const int32_t *ids, size_t n, size_t *size, char *msg,
                                 size_t msg_size) {
    try {
        std::vector<int> list(ids, ids + n);
        std::string text;
        const auto status = m->processor.Decode(list, &text);
        if (!status.ok()) {
            set_message(msg, msg_size, status.ToString());
            return nullptr;
        }
        char *out = static_cast<char *>(std::malloc(text.size() + 1));
        if (!out) return nullptr;
        std::memcpy(out, text.data(), text.size());
        out[text.size()] = 0;
        *size = text.size();
        return out;
    } catch (const std::exception &e) {
        set_message(msg, msg_size, e.what());
        return nullptr;
    }
}

extern "C" int32_t spm_shim_piece_count(const spm_model *m) { return m->processor.GetPieceSize(); }

extern "C" const char *spm_shim_piece(const spm_model *m, int32_t id) { return m->processor.IdToPiece(id).c_str(); }

extern "C" int32_t spm_shim_piece_id(const spm_model *m, const char *piece) {
    const int id = m->processor.PieceToId(piece);
    // PieceToId answers the unknown token's id for an absent piece.
    return id == m->processor.unk_id() && m->processor.IdToPiece(id) != piece ? -1 : id;
}

extern "C" int32_t spm_shim_special_id(const spm_model *m, char which) {
    switch (which) {
    case 'b': return m->processor.bos_id();
    case 'e': return m->processor.eos_id();
    case 'u': return m->processor.unk_id();
    case 'p': return m->processor.pad_id();
    default: return -1;
    }
}

extern "C" float spm_shim_score(const spm_model *m, int32_t id) { return m->processor.GetScore(id); }

extern "C" uint8_t *spm_shim_serialized(const spm_model *m, size_t *size) {
    try {
        const std::string bytes = m->processor.serialized_model_proto();
        uint8_t *out = static_cast<uint8_t *>(std::malloc(bytes.size() + 1));
        if (!out) return nullptr;
        std::memcpy(out, bytes.data(), bytes.size());
        *size = bytes.size();
        return out;
    } catch (const std::exception &) {
        return nullptr;
    }
}
